/* parasol-sim-machine.h — part of libsim's public interface (parasol-sim.h, which includes
 * every part): devices and machines. */
#pragma once

#include "parasol-sim-zoo.h"

G_BEGIN_DECLS

/* ---------------------------------------------------------------------------------- */
/* Devices and machines                                                                */

/* The specification of one accelerator, with the source of its figures. */
typedef struct {
  const char *name;               /* "a100-80gb"                                    */
  const char *vendor_name;        /* "NVIDIA A100 SXM4 80GB"                        */
  double peak_flops[SIM_DTYPE_COUNT]; /* dense FLOP/s per dtype (tensor cores where used) */
  double mem_bandwidth;           /* bytes/s of device memory                      */
  int64_t mem_capacity;           /* bytes                                         */
  int sm_count;                   /* streaming multiprocessors, for wave quantization */
  double launch_overhead;         /* seconds per kernel launch                     */
  const char *source;             /* where the figures come from                   */
  /* Dense FLOP/s of fp32 GEMMs and convolutions on the tensor cores in TF32 (Ampere and
   * later); 0 where the device has no TF32, whose fp32 kernels run on the CUDA cores. */
  double tf32_flops;
  /* The most any matrix product reaches on this device, as a fraction of the peak, in
   * 16-bit types and in fp8: the best shape of a search over shapes (0: not measured). */
  double matmul_fraction, matmul_fraction_fp8;
  /* The fraction of the 16-bit tensor-core peak at which the device's fused attention
   * kernels run a full wave of 128 x 128 blocks, forward and backward: the most a cost
   * model's attention efficiency may reach there (0: not measured). */
  double attention_fraction, attention_bwd_fraction;
} SimDeviceSpec;

SIM_PUBLIC int sim_device_library_n(void);
SIM_PUBLIC const SimDeviceSpec *sim_device_library_get(int i);
SIM_PUBLIC const SimDeviceSpec *sim_device_library_lookup(const char *name);

typedef enum {
  SIM_LINK_NVLINK,
  SIM_LINK_NVSWITCH,
  SIM_LINK_PCIE,
  SIM_LINK_INTERSOCKET,  /* QPI/UPI between host bridges */
  SIM_LINK_NIC,          /* PCIe switch to NIC           */
  SIM_LINK_NETWORK,      /* NIC to switch, switch to switch (InfiniBand, Ethernet) */
  SIM_LINK_KIND_COUNT
} SimLinkKind;

SIM_PUBLIC const char *sim_link_kind_name(SimLinkKind k);

typedef struct _SimMachine SimMachine;

/* Loads a machine by library name ("dgx-a100", "dgx-a100:64" for 64 nodes) or from a JSON
 * file ("format": "parasol-machine").  Errors name the file and the place in it. */
SIM_PUBLIC SimMachine *sim_machine_load(const char *name_or_file, GError **error);
SIM_PUBLIC SimMachine *sim_machine_from_json(const char *text, const char *filename,
                                             int node_count_override, GError **error);
SIM_PUBLIC void sim_machine_free(SimMachine *m);
SIM_PUBLIC const char *sim_machine_get_name(const SimMachine *m);
/* Names of the machines in the embedded library, with one-line descriptions. */
SIM_PUBLIC char **sim_machine_library_names(void);
SIM_PUBLIC char *sim_machine_library_description(const char *name);

SIM_PUBLIC int sim_machine_n_devices(const SimMachine *m);
SIM_PUBLIC int sim_machine_n_nodes(const SimMachine *m);
SIM_PUBLIC int sim_machine_device_node(const SimMachine *m, int dev);
/* The index of @dev inside its node (0..gpus per node - 1). */
SIM_PUBLIC int sim_machine_device_local_rank(const SimMachine *m, int dev);
SIM_PUBLIC int sim_machine_node_n_devices(const SimMachine *m, int node);
SIM_PUBLIC const SimDeviceSpec *sim_machine_device_spec(const SimMachine *m, int dev);
SIM_PUBLIC int sim_machine_n_links(const SimMachine *m);
SIM_PUBLIC SimLinkKind sim_machine_link_kind(const SimMachine *m, int link);
SIM_PUBLIC double sim_machine_link_bandwidth(const SimMachine *m, int link); /* bytes/s */
SIM_PUBLIC double sim_machine_link_latency(const SimMachine *m, int link);   /* seconds */
/* "node3/gpu2->nvswitch" */
SIM_PUBLIC const char *sim_machine_link_name(const SimMachine *m, int link);
/* The route from device @src to device @dst as directed link ids (transfer none; valid
 * while the machine lives).  @src == @dst gives zero links. */
SIM_PUBLIC const int *sim_machine_route(const SimMachine *m, int src, int dst, int *n_links);
/* Bottleneck bandwidth (bytes/s) and summed latency (s) of the route. */
SIM_PUBLIC double sim_machine_bandwidth(const SimMachine *m, int src, int dst);
SIM_PUBLIC double sim_machine_latency(const SimMachine *m, int src, int dst);
SIM_PUBLIC char *sim_machine_to_json(const SimMachine *m);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimMachine, sim_machine_free)

G_END_DECLS
