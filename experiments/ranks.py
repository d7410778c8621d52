"""ranks: an experiment's runs divided among the copies of it that mpirun started.

`mpirun -np N experiments/search-benchmark ...` starts N copies of the script; each runs the
runs whose index modulo N is its rank (as `parasol compare` divides its runs,
docs/distributed.md), and rank 0 collects every copy's rows through files in the output
folder (on several nodes it must be shared, e.g. over NFS) and writes the results.
Without mpirun there is one copy, which runs everything.  The parasol processes a copy
starts do not see mpirun's variables: each is a search of its own.
"""

import json
import os
import time

_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS")


def _first(names, default):
    for n in names:
        v = os.environ.get(n)
        if v and v.isdigit():
            return int(v)
    return default


def rank():
    return _first(_RANK_VARS, 0)


def size():
    return max(1, _first(_SIZE_VARS, 1))


def mine(index):
    """Whether this copy makes run @index."""
    return index % size() == rank()


def child_env():
    """The environment for a parasol started by this copy: without mpirun's variables, so
    that it does not take itself for a rank of the job."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_", "PMI_", "PMIX_", "PMI", "HYDRA_"))}


def _job():
    """A name of this mpirun job, the same in every copy: files of an earlier job are not
    taken for this one's."""
    for n in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "PMI_KVSNAME", "SLURM_STEP_ID"):
        if os.environ.get(n):
            return "".join(c if c.isalnum() else "-" for c in os.environ[n])
    return "job"


def gather(out, rows, poll_s=1.0):
    """Rows of (index, row) made by every copy, in index order, on rank 0; None on the
    others, which leave theirs in @out for rank 0 to read."""
    if size() == 1:
        return [r for _, r in sorted(rows, key=lambda x: x[0])]
    path = os.path.join(out, f".{_job()}-rank-{rank()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(rows, f)
    os.replace(path + ".tmp", path)
    if rank() != 0:
        return None
    everything = []
    for r in range(size()):
        p = os.path.join(out, f".{_job()}-rank-{r}.json")
        while not os.path.exists(p):
            time.sleep(poll_s)
        with open(p) as f:
            everything += [tuple(x) for x in json.load(f)]
        os.remove(p)
    return [r for _, r in sorted(everything, key=lambda x: x[0])]
