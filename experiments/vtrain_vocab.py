"""The vocabulary shapes of the vTrain runs, for experiments/validate-vtrain and
experiments/calibrate-vtrain: GPT-2's 50,257 tokens, padded as Megatron pads them or
split as vTrain's own model splits them."""

VOCAB = 50257


def padded_vocab(tp):
    """Megatron's --make-vocab-size-divisible-by 128, times the tensor-parallel size."""
    m = 128 * tp
    return (VOCAB + m - 1) // m * m


def vtrain_vocab(tp):
    """The vocabulary as vTrain's own model of these runs shapes it: 50,257 // TP rows a
    rank, unpadded (odd at TP 1, a multiple of 8 at TP 2, of 4 at TP 4, of 2 at TP 8)."""
    return VOCAB // tp * tp


# By the name a calibration file records ("single_vocab") and calibrate-vtrain's --vocab.
SHAPES = {"megatron": padded_vocab, "vtrain": vtrain_vocab}
