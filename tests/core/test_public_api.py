"""The public surface of gradvault.core and the direction of dependencies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gradvault.core as gv

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


def test_design_names_are_exported() -> None:
    assert DESIGN_NAMES <= set(gv.__all__)
    for name in gv.__all__:
        assert hasattr(gv, name), name


def test_exported_names_are_pinned() -> None:
    assert sorted(gv.__all__) == sorted(set(gv.__all__))
    assert len(gv.__all__) == 115, sorted(gv.__all__)


def test_autograd_subpackage_names() -> None:
    from gradvault.core.autograd import functional, grad, gradcheck

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
