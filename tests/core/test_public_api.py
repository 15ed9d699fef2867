"""The public surface of gradvault.core and the direction of dependencies."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import gradvault.core as gv
from gradvault.core.autodiff.op_table import op_table

ROOT = Path(__file__).resolve().parents[2]

DESIGN_NAMES = {
    "Tensor",
    "tensor",
    "no_grad",
    "Module",
    "Linear",
    "ParamId",
    "SGD",
    "Adam",
    "GradientsParams",
    "GradientsAccumulator",
    "GradientsParamsRecord",
    "RecorderError",
    "Recorder",
}


EXPORTED_NAMES = [
    "Adam",
    "AdamW",
    "AuthError",
    "AutogradError",
    "BackendMismatchError",
    "ChecksumMismatchError",
    "ClientRequestError",
    "ConflictingOptionsError",
    "Device",
    "DeviceError",
    "DistributedSnapshotError",
    "Dropout",
    "DtypeMismatchError",
    "DuplicateParamError",
    "Embedding",
    "FormatVersionError",
    "GELU",
    "GradcheckError",
    "GradientRecordEntry",
    "Gradients",
    "GradientsAccumulator",
    "GradientsCapture",
    "GradientsParams",
    "GradientsParamsRecord",
    "GradvaultError",
    "InplaceModificationError",
    "IntegrationError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "InvalidFieldError",
    "InvalidParamIdError",
    "InvalidRangeError",
    "InvalidSnapshotIdError",
    "InvalidStorePathError",
    "InvalidUploadError",
    "LayerNorm",
    "Linear",
    "MLP",
    "ManifestError",
    "MissingGradientError",
    "Module",
    "ModuleRecord",
    "Optimizer",
    "OptimizerRecord",
    "Param",
    "ParamId",
    "ParamIdMismatchError",
    "ReLU",
    "Recorder",
    "RecorderError",
    "ResumeStateError",
    "SGD",
    "Sequential",
    "ShapeMismatchError",
    "ShardInfo",
    "ShardedSnapshotError",
    "SizeMismatchError",
    "SnapshotBusyError",
    "SnapshotHandle",
    "SnapshotInfo",
    "SnapshotNotFoundError",
    "SnapshotStore",
    "StoreKeyNotFoundError",
    "StoreNotFoundError",
    "StoreUnavailableError",
    "SyncRecorder",
    "Tanh",
    "Tensor",
    "UnsupportedOptionError",
    "UnsupportedSetupError",
    "abs",
    "arange",
    "argmax",
    "autograd",
    "backend",
    "bfloat16",
    "bool_",
    "cat",
    "clamp",
    "clone",
    "cross_entropy",
    "cuda_available",
    "device",
    "enable_grad",
    "exp",
    "float16",
    "float32",
    "float64",
    "from_dlpack",
    "full",
    "full_like",
    "gelu",
    "inference_mode",
    "int32",
    "int64",
    "linear",
    "log",
    "log_softmax",
    "manual_seed",
    "matmul",
    "max",
    "mean",
    "min",
    "mse_loss",
    "new_snapshot_id",
    "no_grad",
    "ones",
    "ones_like",
    "open_store",
    "permute",
    "pow",
    "rand",
    "rand_like",
    "randn",
    "randn_like",
    "record_rules",
    "relu",
    "reshape",
    "set_grad_enabled",
    "sigmoid",
    "softmax",
    "sqrt",
    "stack",
    "sum",
    "tanh",
    "tensor",
    "transpose",
    "var",
    "where",
    "zeros",
    "zeros_like",
]


OPS_EXPORTED_NAMES = [
    "ValuesIndices",
    "abs",
    "add",
    "argmax",
    "cat",
    "clamp",
    "clone",
    "cross_entropy",
    "div",
    "erf",
    "exp",
    "expand",
    "flatten",
    "gelu",
    "getitem",
    "index_put",
    "linear",
    "log",
    "log_softmax",
    "logical_and",
    "logical_or",
    "matmul",
    "max",
    "mean",
    "min",
    "mse_loss",
    "mul",
    "neg",
    "permute",
    "pow",
    "relu",
    "reshape",
    "sigmoid",
    "softmax",
    "sqrt",
    "squeeze",
    "stack",
    "std",
    "sub",
    "sum",
    "tanh",
    "transpose",
    "unsqueeze",
    "var",
    "view",
    "where",
]

#: the Tensor methods and operators that op registrations give (core/autodiff/op_table.py)
TENSOR_OP_METHODS = [
    "__add__",
    "__and__",
    "__eq__",
    "__ge__",
    "__getitem__",
    "__gt__",
    "__invert__",
    "__le__",
    "__lt__",
    "__matmul__",
    "__mul__",
    "__ne__",
    "__neg__",
    "__or__",
    "__pow__",
    "__radd__",
    "__rmatmul__",
    "__rmul__",
    "__rpow__",
    "__rsub__",
    "__rtruediv__",
    "__sub__",
    "__truediv__",
    "abs",
    "add",
    "argmax",
    "clamp",
    "clip",
    "clone",
    "contiguous",
    "div",
    "erf",
    "exp",
    "expand",
    "flatten",
    "log",
    "log_softmax",
    "matmul",
    "max",
    "mean",
    "min",
    "mul",
    "neg",
    "permute",
    "pow",
    "relu",
    "reshape",
    "sigmoid",
    "softmax",
    "sqrt",
    "squeeze",
    "std",
    "sub",
    "sum",
    "tanh",
    "transpose",
    "unsqueeze",
    "var",
    "view",
]


def test_design_names_are_exported() -> None:
    assert DESIGN_NAMES <= set(gv.__all__)
    for name in gv.__all__:
        assert hasattr(gv, name), name


def test_exported_names_are_pinned() -> None:
    """Adding or removing a public name is a decision: it shows up here, by name."""
    assert len(gv.__all__) == len(set(gv.__all__))
    assert sorted(gv.__all__) == EXPORTED_NAMES


def test_ops_names_and_tensor_op_methods_are_pinned() -> None:
    """The op registrations give these names; dropping or adding one is a decision too."""
    assert sorted(gv.ops.__all__) == OPS_EXPORTED_NAMES
    for name in gv.ops.__all__:
        assert hasattr(gv.ops, name), name
    installed = sorted(
        method
        for name in op_table
        for method in (*op_table.entry(name).methods, *op_table.entry(name).reflected)
    )
    assert installed == TENSOR_OP_METHODS
    for name in TENSOR_OP_METHODS:
        assert callable(getattr(gv.Tensor, name)), name


def test_autograd_subpackage_names() -> None:
    from gradvault.core.autodiff.autograd import functional, grad, gradcheck

    assert callable(grad) and callable(gradcheck)
    for name in ("vjp", "jvp", "jacobian", "hessian", "hvp", "vhp"):
        assert callable(getattr(functional, name))


def test_core_imports_from_any_folder_without_http_libraries(tmp_path: Path) -> None:
    code = (
        "import sys, gradvault.core\n"
        "bad = [m for m in ('fastapi', 'httpx', 'gradvault.service', 'gradvault.client') "
        "if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_error_tree_has_one_root() -> None:
    for name in gv.__all__:
        value = getattr(gv, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, gv.GradvaultError), name


def _runtime_imports() -> set[str]:
    """The top-level modules the core imports (anywhere in a file: optional ones too)."""
    found: set[str] = set()
    for path in (ROOT / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def test_runtime_dependencies_are_the_ones_the_core_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # a distribution's name as its module is imported (google-crc32c: google_crc32c)
    names = [
        re.split(r"[<>=!~\[ ;]", spec)[0].replace("-", "_") for spec in project["dependencies"]
    ]
    assert len(names) == len(set(names))
    assert set(names) <= _runtime_imports(), "a runtime dependency the core never imports"
    for extra, specs in project["optional-dependencies"].items():
        if extra != "dev":  # dev repeats what the tests need
            extra_names = {re.split(r"[<>=!~\[ ;]", spec)[0].replace("-", "_") for spec in specs}
            assert not extra_names & set(names), f"extra {extra!r} repeats a dependency"
