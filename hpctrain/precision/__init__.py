"""Precision has one home: which numbers a run computes in, decided once from ``trainer.precision`` and the
layout, read alike by the trainer, the planner and the footprint measurement. Torch-free (the planner runs
on login nodes); :mod:`hpctrain.precision.amp` turns the decision into torch's autocast, loss scaler and
FSDP mixed-precision policy.

A run trains in one of three regimes:

- ``fp32``: everything in float32;
- ``autocast``: float32 master weights, optimizer and gradients; matmuls (and what autocast lists) in
  bf16/fp16 under ``torch.autocast`` (Micikevicius et al. 2018, "Mixed Precision Training");
- ``fsdp_mixed``: where FSDP shards the parameters, its mixed-precision policy all-gathers them in bf16/fp16
  and the whole forward/backward runs in that dtype, while the sharded master copy, the optimizer and the
  gradient reduction stay float32 (torch's FSDP2 ``MixedPrecisionPolicy``); no autocast around the model.

fp16 also scales the loss (a ``GradScaler``; sharded where ranks hold different gradients), bf16 does not.

``fp8`` trains in bf16's regime (autocast, or FSDP's bf16 mixed precision) and, in addition, runs the matmuls
of the Linear layers that gain from it in float8 through torchao's float8 training (``Float8Linear`` with
dynamic tensor-wise scales: Micikevicius et al. 2022, "FP8 Formats for Deep Learning"; E4M3 forward, gradients
scaled per tensor, so no loss scaler). Which layers: :func:`float8_converts`. It needs a GPU with float8
tensor cores (:data:`FLOAT8_MIN_CAPABILITY`) and torchao; :func:`float8_problem` says why a device cannot.

TF32: where float32 matmuls remain in a run that asked for less than fp32 (bf16, fp16, fp8), they may use
TF32 tensor cores (:func:`allows_tf32`); an fp32 run keeps IEEE float32 matmuls.

Which data-sheet peak a run's matmuls are priced at (the planner's step time, the trainer's MFU):
:func:`matmul_peak`, one of :data:`PEAKS`.
"""

from __future__ import annotations

PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
REGIMES = ("fp32", "autocast", "fsdp_mixed")
# Float8 tensor cores (torch._scaled_mm) exist from compute capability 8.9 on: Ada (L4, L40S, RTX 40xx),
# Hopper (H100, H200) and later (NVIDIA's CUDA C++ Programming Guide, "Compute capabilities"; torchao's
# float8 README states the same requirement).
FLOAT8_MIN_CAPABILITY = (8, 9)
# The dense (no sparsity) peaks a device's data sheet gives, one per kind of matmul a run may do: IEEE
# float32 on CUDA cores, TF32 / bf16 (= fp16) / float8 on tensor cores.
PEAKS = ("fp32", "tf32", "bf16", "fp8")
FLOAT8_DEVICES = "a CUDA GPU of compute capability ≥ 8.9 (H100, H200, L40S, L4, RTX 40xx)"


def regime(precision: str, sharded: bool) -> str:
    """The regime of a run in ``precision`` whose parameters FSDP shards (``sharded``) or not (fp8: bf16's,
    the float8 matmuls come on top)."""
    if precision == "fp32":
        return "fp32"
    return "fsdp_mixed" if sharded else "autocast"


def regimes_of(precision: str, can_shard: bool) -> list[str]:
    """Every regime a run in ``precision`` may train in under some layout: the planner proposes layouts that
    shard only where there is more than one rank (``can_shard``)."""
    if precision == "fp32":
        return ["fp32"]
    return ["autocast", "fsdp_mixed"] if can_shard else ["autocast"]


def scales_loss(precision: str) -> bool:
    """fp16's narrow exponent range needs loss scaling; bf16 has float32's range and does not, nor fp8,
    whose Float8Linear scales each tensor it casts (gradients included) from its own absolute maximum."""
    return precision == "fp16"


def compute_precision(precision: str) -> str:
    """The 16- or 32-bit precision autocast and FSDP's policy compute in: fp8's is bf16 (only the matmuls of
    the converted Linear layers go to float8)."""
    return "bf16" if precision == "fp8" else precision


def allows_tf32(precision: str) -> bool:
    """Whether float32 matmuls that remain (outside autocast's list, the optimizer's none) may use TF32
    (10-bit mantissa): yes in a run that chose a lower precision anyway, never in an fp32 run, whose results
    are compared bit for bit against single-process references."""
    return precision != "fp32"


def matmul_peak(precision: str) -> str:
    """The peak (one of :data:`PEAKS`) that prices the matmuls of a run in ``precision``: an fp32 run's are
    float32 on CUDA cores (``tf32`` where :func:`allows_tf32` lets them use TF32 tensor cores, which it
    never does today); bf16 and fp16 runs' are 16-bit tensor-core matmuls (the dense fp16 and bf16 peaks are
    the same on A100, H100 and H200); fp8's are bf16's too, its float8 layers' FLOPs priced at ``fp8`` on
    top (the planner's ``float8_share``)."""
    if compute_precision(precision) == "fp32":
        return "tf32" if allows_tf32(precision) else "fp32"
    return "bf16"


def float8_converts(out_features: int, in_features: int) -> bool:
    """Whether a Linear layer of this size gains from float8 matmuls under tensor-wise dynamic scaling.

    Both dimensions must be multiples of 16 (``torch._scaled_mm``'s requirement). Below a size the casts
    (an absolute-maximum reduction and a scaled copy of input, weight and gradient) cost more than the faster
    matmul saves: torchao's performance table for tensor-wise scaling on H100 (torchao/float8/README.md,
    "Performance") shows no gain where K ≤ 4096 and N ≤ 1024, the rule its own ``_auto_filter_for_recipe``
    applies; the same rule is applied here, torch-free, so that the planner prices the same layers."""
    n, k = out_features, in_features
    if n % 16 or k % 16:
        return False
    return not (k <= 4096 and n <= 1024)


def float8_problem(capability: tuple[int, int] | None, have_torchao: bool) -> str | None:
    """Why a device of this compute ``capability`` (None: no CUDA GPU) cannot train in fp8; None if it can."""
    if capability is None:
        return f"float8 training needs {FLOAT8_DEVICES}; this machine has none"
    if tuple(capability) < FLOAT8_MIN_CAPABILITY:
        major, minor = capability
        return f"float8 training needs {FLOAT8_DEVICES}; this GPU is {major}.{minor}"
    if not have_torchao:
        return "float8 training needs torchao: pip install 'hpctrain[float8]'"
    return None
