"""gradvault.core: autodiff on NumPy/CuPy, modules, optimizers, gradients, records, the store."""

from __future__ import annotations

from . import autograd
from .accumulator import GradientsAccumulator
from .autograd import Gradients, enable_grad, inference_mode, no_grad, set_grad_enabled
from .backend import Device, cuda_available, device
from .errors import (
    AutogradError,
    BackendMismatchError,
    ChecksumMismatchError,
    DeviceError,
    DtypeMismatchError,
    DuplicateParamError,
    FormatVersionError,
    GradvaultError,
    InplaceModificationError,
    InvalidParamIdError,
    InvalidSnapshotIdError,
    MissingGradientError,
    ParamIdMismatchError,
    RecorderError,
    ShapeMismatchError,
    SizeMismatchError,
    SnapshotBusyError,
    SnapshotNotFoundError,
    StoreUnavailableError,
)
from .factories import (
    arange,
    full,
    full_like,
    manual_seed,
    ones,
    ones_like,
    rand,
    rand_like,
    randn,
    randn_like,
    tensor,
    zeros,
    zeros_like,
)
from .grads import GradientsParams
from .nn import (
    GELU,
    MLP,
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    Module,
    ModuleRecord,
    Param,
    ReLU,
    Sequential,
    Tanh,
)
from .ops import (
    abs,
    argmax,
    cat,
    clamp,
    clone,
    cross_entropy,
    exp,
    gelu,
    linear,
    log,
    log_softmax,
    matmul,
    max,
    mean,
    min,
    mse_loss,
    permute,
    pow,
    relu,
    reshape,
    sigmoid,
    softmax,
    sqrt,
    stack,
    sum,
    tanh,
    transpose,
    var,
    where,
)
from .optim import SGD, Adam, AdamW, Optimizer, OptimizerRecord
from .param_id import ParamId
from .record import GradientRecordEntry, GradientsParamsRecord
from .recorder import Recorder, SnapshotHandle, SyncRecorder
from .store import SnapshotInfo, SnapshotStore, open_store
from .tensor import Tensor, bool_, float16, float32, float64, int32, int64

__all__ = [
    "GELU", "MLP", "SGD", "Adam", "AdamW", "Dropout", "Embedding", "GradientsAccumulator",
    "GradientsParams", "LayerNorm", "Linear", "Module", "ModuleRecord", "Optimizer",
    "OptimizerRecord", "Param", "ReLU", "Recorder", "Sequential", "SnapshotHandle",
    "SnapshotInfo", "SnapshotStore", "SyncRecorder", "Tanh", "open_store",
    "AutogradError", "BackendMismatchError", "ChecksumMismatchError", "Device", "DeviceError",
    "DtypeMismatchError", "DuplicateParamError", "FormatVersionError", "GradientRecordEntry",
    "Gradients", "GradientsParamsRecord", "GradvaultError", "InplaceModificationError",
    "InvalidParamIdError",
    "InvalidSnapshotIdError", "MissingGradientError", "ParamId", "ParamIdMismatchError",
    "RecorderError", "ShapeMismatchError", "SizeMismatchError", "SnapshotBusyError",
    "SnapshotNotFoundError", "StoreUnavailableError", "Tensor", "abs", "arange", "argmax",
    "autograd", "bool_", "cat", "clamp", "clone", "cross_entropy", "cuda_available", "device",
    "enable_grad", "exp", "float16", "float32", "float64", "full", "full_like", "gelu",
    "inference_mode", "int32", "int64", "linear", "log", "log_softmax", "manual_seed", "matmul",
    "max",
    "mean", "min", "mse_loss", "no_grad", "ones", "ones_like", "permute", "pow", "rand",
    "rand_like", "randn", "randn_like", "relu", "reshape", "set_grad_enabled", "sigmoid",
    "softmax", "sqrt", "stack", "sum", "tanh", "tensor", "transpose", "var", "where", "zeros",
    "zeros_like",
]
