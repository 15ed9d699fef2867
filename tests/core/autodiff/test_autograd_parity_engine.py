"""Parity with PyTorch for the engine's contracts: the layout, identity and aliasing of
``.grad``, ``.data``, hook handles and the argument checks PyTorch makes.

Each test runs one small program in both libraries and compares what a user sees:
values, byte strides, object identity, ``requires_grad``/``is_leaf``, and whether it
raises (and which built-in exception category the error belongs to).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import GradientsParams, GradvaultError, autograd

torch = pytest.importorskip("torch")
torch_functional = pytest.importorskip("torch.autograd.functional")

pytestmark = [
    pytest.mark.torch,
    # create_graph=True on backward() warns about a reference cycle in torch
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

BASE = np.arange(1.0, 25.0).reshape(2, 3, 4) / 7


def gv_leaf(values: Any) -> gv.Tensor:
    return gv.tensor(np.asarray(values, dtype=np.float64), dtype=gv.float64, requires_grad=True)


def torch_leaf(values: Any) -> Any:
    return torch.tensor(np.asarray(values, dtype=np.float64), requires_grad=True)


def host(t: Any) -> np.ndarray:
    if isinstance(t, gv.Tensor):
        return np.array(t.detach().numpy())
    return t.detach().numpy().copy()


def byte_strides(t: Any) -> tuple[int, ...]:
    if isinstance(t, gv.Tensor):
        return t.detach().numpy().strides
    return tuple(s * t.element_size() for s in t.stride())


_CATEGORIES = (NotImplementedError, TypeError, ValueError, RuntimeError)


def outcome(run: Callable[[], Any]) -> str:
    """``"ok"``, or the most specific built-in category of the error ``run`` raised."""
    try:
        run()
    except Exception as exc:  # the category is what the tests compare
        return next((c.__name__ for c in _CATEGORIES if isinstance(exc, c)), type(exc).__name__)
    return "ok"


def assert_same_outcome(gv_run: Callable[[], Any], torch_run: Callable[[], Any]) -> str:
    """Both raise an error of the same category (gradvault's under GradvaultError), or neither."""
    expected = outcome(torch_run)
    try:
        gv_run()
    except Exception as exc:
        found = next((c.__name__ for c in _CATEGORIES if isinstance(exc, c)), type(exc).__name__)
        assert found == expected, f"gradvault raised {type(exc).__name__}: {exc}"
        if not isinstance(exc, TypeError):
            assert isinstance(exc, GradvaultError), f"{type(exc).__name__}: {exc}"
        assert str(exc), "the error says nothing"
        return found
    assert expected == "ok", f"torch raised {expected}; gradvault did not"
    return "ok"


# ---------------------------------------------------------------------- gradient layout
# views of BASE that become leaves: (gradvault, torch) spellings of the same view
LAYOUTS: dict[str, Callable[[Any], Any]] = {
    "contiguous": lambda b: b[0],
    "transposed": lambda b: b[0].T,
    "permuted 3-d": lambda b: b.permute(2, 0, 1),
    "sliced (not dense)": lambda b: b[:, :, ::2],
    "sliced and transposed": lambda b: b[0, :, ::2].T,
    "broadcast": lambda b: b[0, :1].expand(3, 4),
}


def _layout_leaf(lib: str, layout: str) -> Any:
    base = gv.tensor(BASE, dtype=gv.float64) if lib == "gv" else torch.tensor(BASE)
    return LAYOUTS[layout](base).detach().requires_grad_()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_grad_takes_the_layout_of_a_dense_leaf_and_keeps_it(layout: str) -> None:
    seen: dict[str, list[Any]] = {}
    for lib in ("gv", "torch"):
        w = _layout_leaf(lib, layout)
        (w * w).sum().backward()
        first = w.grad
        steps = [byte_strides(first)]
        first.mul_(2)  # an in-place write to a fresh .grad (copy-on-write moves it)
        steps.append(byte_strides(w.grad))
        (w * w * 3).sum().backward()  # accumulation
        steps += [byte_strides(w.grad), w.grad is first, host(w.grad)]
        seen[lib] = steps
    gv_steps, torch_steps = seen["gv"], seen["torch"]
    assert gv_steps[:4] == torch_steps[:4]
    np.testing.assert_allclose(gv_steps[4], torch_steps[4], rtol=1e-12)


@pytest.mark.parametrize("layout", ["transposed", "permuted 3-d", "sliced and transposed"])
def test_grad_layout_with_create_graph_and_after_a_snapshot(layout: str) -> None:
    w = _layout_leaf("gv", layout)
    tw = _layout_leaf("torch", layout)
    (w * w).sum().backward(create_graph=True)
    (tw * tw).sum().backward(create_graph=True)
    assert byte_strides(w.grad) == byte_strides(tw.grad)

    w = _layout_leaf("gv", layout)
    tw = _layout_leaf("torch", layout)
    (w * w).sum().backward()
    (tw * tw).sum().backward()
    grads = GradientsParams()
    grads.register(gv.ParamId(7), w.grad, name="w")
    record = grads.try_to_record()
    w.grad.add_(1)  # first write after the snapshot: the grad moves to a buffer of its own
    tw.grad.add_(1)
    assert byte_strides(w.grad) == byte_strides(tw.grad)
    np.testing.assert_allclose(record[gv.ParamId(7)].array, host(tw.grad) - 1, rtol=1e-12)


def test_a_seed_in_another_layout_gives_a_grad_in_the_leafs_layout() -> None:
    seed = np.arange(12.0).reshape(4, 3)
    w = gv_leaf(np.ones((3, 4)))
    tw = torch_leaf(np.ones((3, 4)))
    w.backward(gv.tensor(seed, dtype=gv.float64).T)
    tw.backward(torch.tensor(seed).T)
    assert byte_strides(w.grad) == byte_strides(tw.grad)
    np.testing.assert_array_equal(host(w.grad), host(tw.grad))


# ---------------------------------------------------------------------- .grad identity
def _seeded_leaf_backward(lib: str, seed_requires_grad: bool) -> list[Any]:
    if lib == "gv":
        v = gv_leaf([1.0, 2.0])
        seed = gv.tensor([1.0, 1.0], dtype=gv.float64, requires_grad=seed_requires_grad)
    else:
        v = torch_leaf([1.0, 2.0])
        seed = torch.tensor([1.0, 1.0], dtype=torch.float64, requires_grad=seed_requires_grad)
    v.backward(seed, create_graph=True)
    facts = [v.grad is seed, v.grad.requires_grad, v.grad.is_leaf]
    with gv.no_grad() if lib == "gv" else torch.no_grad():
        seed.mul_(10)
    return [*facts, host(v.grad)]


@pytest.mark.parametrize("seed_requires_grad", [False, True])
def test_create_graph_backward_on_a_leaf_does_not_alias_the_seed(seed_requires_grad: bool) -> None:
    gv_facts = _seeded_leaf_backward("gv", seed_requires_grad)
    torch_facts = _seeded_leaf_backward("torch", seed_requires_grad)
    assert gv_facts[:3] == torch_facts[:3]
    np.testing.assert_array_equal(gv_facts[3], torch_facts[3])
    np.testing.assert_array_equal(gv_facts[3], [1.0, 1.0])


def _two_passes(lib: str, first: bool | None, second: bool) -> list[Any]:
    """Identity of ``.grad`` across two backward passes (``first=None``: an assigned grad)."""
    leaf = gv_leaf if lib == "gv" else torch_leaf
    x = leaf([1.0, 2.0])
    if first is None:
        x.grad = leaf([0.5, 0.5])  # a grad that is itself a leaf requiring grad
    else:
        (x * x).sum().backward(create_graph=first)
    g1 = x.grad
    (x * x).sum().backward(create_graph=second)
    return [x.grad is g1, g1.requires_grad, x.grad.requires_grad, host(x.grad)]


@pytest.mark.parametrize("first", [False, True, None], ids=["plain", "create_graph", "assigned"])
@pytest.mark.parametrize("second", [False, True], ids=["then plain", "then create_graph"])
def test_grad_is_accumulated_in_place_unless_create_graph(first: bool | None, second: bool) -> None:
    gv_facts = _two_passes("gv", first, second)
    torch_facts = _two_passes("torch", first, second)
    assert gv_facts[:3] == torch_facts[:3]
    np.testing.assert_allclose(gv_facts[3], torch_facts[3], rtol=1e-12)


def _retained_passes(lib: str, via_inputs: bool) -> list[Any]:
    x = (gv_leaf if lib == "gv" else torch_leaf)([1.0, 2.0])
    y = x * 2
    if via_inputs:
        (y * y).sum().backward(inputs=[y], retain_graph=True)
    else:
        y.retain_grad()
        (y * y).sum().backward(retain_graph=True)
    g1 = y.grad
    (y * y).sum().backward(inputs=[y] if via_inputs else None)
    return [y.grad is g1, host(g1), host(y.grad)]


@pytest.mark.parametrize("via_inputs", [False, True], ids=["retain_grad", "inputs"])
def test_a_non_leaf_grad_is_replaced_by_each_pass(via_inputs: bool) -> None:
    gv_facts = _retained_passes("gv", via_inputs)
    torch_facts = _retained_passes("torch", via_inputs)
    assert gv_facts[0] == torch_facts[0]
    np.testing.assert_allclose(gv_facts[1], torch_facts[1], rtol=1e-12)
    np.testing.assert_allclose(gv_facts[2], torch_facts[2], rtol=1e-12)


# ---------------------------------------------------------------------- .data
def _data_bypasses_the_version_check(lib: str) -> list[Any]:
    x = (gv_leaf if lib == "gv" else torch_leaf)([1.0, 2.0, 3.0])
    y = x**2
    alias = x.data
    alias.mul_(2)
    y.sum().backward()
    return [alias.requires_grad, alias.is_leaf, host(x), host(x.grad)]


def test_writes_through_data_bypass_the_version_check() -> None:
    gv_facts = _data_bypasses_the_version_check("gv")
    torch_facts = _data_bypasses_the_version_check("torch")
    assert gv_facts[:2] == torch_facts[:2]
    np.testing.assert_allclose(gv_facts[2], torch_facts[2], rtol=1e-12)
    np.testing.assert_allclose(gv_facts[3], torch_facts[3], rtol=1e-12)


SET_DATA: dict[str, tuple[bool, Callable[[Any], Any]]] = {
    # name: (target requires grad, new data given the library's namespace)
    "same shape": (True, lambda lib: lib.zeros(3, dtype=lib.float64)),
    "another shape": (True, lambda lib: lib.zeros(5, dtype=lib.float64)),
    "another float dtype": (True, lambda lib: lib.zeros(3, dtype=lib.float32)),
    "int on requires_grad": (True, lambda lib: lib.zeros(3, dtype=lib.int64)),
    "int without grad": (False, lambda lib: lib.zeros(3, dtype=lib.int64)),
    "a tensor requiring grad": (False, lambda lib: lib.ones(3, dtype=lib.float64).requires_grad_()),
    "a list": (True, lambda lib: [1.0, 2.0, 3.0]),
}


@pytest.mark.parametrize("case", list(SET_DATA))
def test_data_can_be_assigned_as_in_torch(case: str) -> None:
    requires_grad, make = SET_DATA[case]
    facts = {}
    for name, lib in (("gv", gv), ("torch", torch)):
        x = lib.tensor([1.0, 2.0, 3.0], dtype=lib.float64, requires_grad=requires_grad)
        new = make(lib)

        def assign(x: Any = x, new: Any = new) -> None:
            x.data = new

        facts[name] = [outcome(assign)]
        if facts[name][0] == "ok":
            with gv.no_grad() if name == "gv" else torch.no_grad():
                new.add_(1)  # x now reads new's buffer
            facts[name] += [x.shape, str(x.dtype).removeprefix("torch."), x.requires_grad]
            facts[name] += [x.is_leaf, host(x).tolist()]
    assert facts["gv"] == facts["torch"]


def test_assigned_data_is_what_a_saved_tensor_reads() -> None:
    results = []
    for lib, leaf in ((gv, gv_leaf), (torch, torch_leaf)):
        x = leaf([1.0, 2.0, 3.0])
        y = x * x
        x.data = lib.ones(3, dtype=lib.float64)
        y.sum().backward()
        results.append(host(x.grad))
    np.testing.assert_array_equal(results[0], results[1])


def test_data_aliases_never_write_into_a_snapshot() -> None:
    pid = gv.ParamId(11)
    x = gv_leaf([1.0, 2.0])
    (x * x).sum().backward()
    grad = x.grad
    alias = grad.data  # own version counter, same buffer

    held = GradientsParams()
    held.register(pid, alias, name="alias")
    record = held.try_to_record()
    grad.add_(5)  # writes the buffer the alias reads
    np.testing.assert_array_equal(record[pid].array, [2.0, 4.0])
    np.testing.assert_array_equal(host(alias), [7.0, 9.0])

    held = GradientsParams()
    held.register(pid, grad, name="grad")
    record = held.try_to_record()
    replacement = gv.tensor([0.0, 0.0], dtype=gv.float64)
    grad.data = replacement
    second = GradientsParams()
    second.register(pid, grad, name="grad")
    record_after = second.try_to_record()
    replacement.add_(3)  # the new buffer is shared with `replacement`
    grad.add_(1)
    np.testing.assert_array_equal(record[pid].array, [7.0, 9.0])
    np.testing.assert_array_equal(record_after[pid].array, [0.0, 0.0])
    np.testing.assert_array_equal(host(grad), [4.0, 4.0])

    source = gv.tensor([1.0, 1.0], dtype=gv.float64)  # never aliased: the snapshot holds it
    held = GradientsParams()
    held.register(pid, source, name="source")
    record = held.try_to_record()
    grad.data = source
    grad.mul_(10)
    np.testing.assert_array_equal(record[pid].array, [1.0, 1.0])
    np.testing.assert_array_equal(host(source), [10.0, 10.0])


# ---------------------------------------------------------------------- hooks
def test_register_hook_returns_a_removable_handle() -> None:
    results = []
    for leaf in (gv_leaf, torch_leaf):
        x = leaf([1.0, 2.0])
        handle = x.register_hook(lambda g: g * 2)
        kept = x.register_hook(lambda g: g + 1)
        handle.remove()
        handle.remove()  # a second remove does nothing
        (x * 1).sum().backward()
        after_remove = host(x.grad)
        kept.remove()
        x.grad = None
        with x.register_hook(lambda g: g * 3):
            (x * 1).sum().backward()
        in_context = host(x.grad)
        (x * 1).sum().backward()
        results.append((after_remove, in_context, host(x.grad)))
    for gv_values, torch_values in zip(*results, strict=True):
        np.testing.assert_array_equal(gv_values, torch_values)


HOOK_RESULTS: dict[str, Callable[[Any], Any]] = {
    "the same gradient": lambda g: g * 2,
    "another shape": lambda g: g[:2],
    "another rank": lambda g: g.reshape(3, 1),
    "another dtype": lambda g: g.float(),
    "not a tensor": lambda g: 5.0,
}


@pytest.mark.parametrize("result", list(HOOK_RESULTS))
@pytest.mark.parametrize("on", ["leaf", "non-leaf"])
def test_a_hook_cannot_change_the_gradients_shape_or_dtype(result: str, on: str) -> None:
    hook = HOOK_RESULTS[result]

    def program(leaf: Callable[[Any], Any]) -> Callable[[], Any]:
        x = leaf([1.0, 2.0, 3.0])
        target = x if on == "leaf" else x * 2
        target.register_hook(hook)
        return lambda: (target * 1).sum().backward()

    assert_same_outcome(program(gv_leaf), program(torch_leaf))


# ---------------------------------------------------------------------- checks
GRAD_ASSIGNMENTS: dict[str, Callable[[Any, Any], Any]] = {
    "float64 grad on float32": lambda lib, x: lib.zeros(3, dtype=lib.float64),
    "another shape": lambda lib, x: lib.zeros(4, dtype=lib.float32),
    "itself": lambda lib, x: x,
    "a list": lambda lib, x: [0.0, 0.0, 0.0],
    "matching": lambda lib, x: lib.zeros(3, dtype=lib.float32),
}


@pytest.mark.parametrize("case", list(GRAD_ASSIGNMENTS))
def test_assigning_grad_checks_dtype_shape_and_identity(case: str) -> None:
    def program(lib: Any) -> Callable[[], Any]:
        x = lib.zeros(3, dtype=lib.float32, requires_grad=True)
        value = GRAD_ASSIGNMENTS[case](lib, x)
        return lambda: setattr(x, "grad", value)

    assert_same_outcome(program(gv), program(torch))


@pytest.mark.parametrize("call", ["method", "function"])
@pytest.mark.parametrize("empty", [[], ()], ids=["list", "tuple"])
def test_backward_with_empty_inputs_raises(call: str, empty: Any) -> None:
    def program(lib: Any, leaf: Callable[[Any], Any]) -> Callable[[], Any]:
        x = leaf([1.0, 2.0])
        loss = (x * x).sum()
        if call == "method":
            return lambda: loss.backward(inputs=empty)
        return lambda: lib.autograd.backward(loss, inputs=empty)

    assert assert_same_outcome(program(gv, gv_leaf), program(torch, torch_leaf)) == "RuntimeError"


DETACH_IN_PLACE: dict[str, Callable[[Any, Any], Any]] = {
    "a slice of a leaf": lambda lib, x: x[1:4],
    "a view of a constant": lambda lib, x: lib.zeros(5, dtype=lib.float64)[1:4],
    "a transpose": lambda lib, x: x.reshape(5, 1).T,
    "a detached tensor": lambda lib, x: x.detach(),
    "a non-leaf": lambda lib, x: x * 2,
}


@pytest.mark.parametrize("case", list(DETACH_IN_PLACE))
def test_detach_in_place_refuses_views(case: str) -> None:
    def program(lib: Any, leaf: Callable[[Any], Any]) -> Callable[[], Any]:
        target = DETACH_IN_PLACE[case](lib, leaf([1.0, 2.0, 3.0, 4.0, 5.0]))
        return lambda: (target.detach_(), target.requires_grad, target.is_leaf)

    assert_same_outcome(program(gv, gv_leaf), program(torch, torch_leaf))


@pytest.mark.parametrize("missing", [0, 1])
def test_grad_refuses_an_output_that_does_not_require_grad(missing: int) -> None:
    def program(lib: Any, leaf: Callable[[Any], Any]) -> Callable[[], Any]:
        x = leaf([1.0, 2.0])
        outputs = [(x * x).sum()]
        outputs.insert(missing, lib.tensor(1.0, dtype=lib.float64))
        return lambda: lib.autograd.grad(outputs, x)

    assert assert_same_outcome(program(gv, gv_leaf), program(torch, torch_leaf)) == "RuntimeError"
    x = gv_leaf([1.0])
    outputs = [(x * 2).sum()]
    outputs.insert(missing, gv.tensor(1.0))
    with pytest.raises(GradvaultError, match=f"element {missing} "):
        autograd.grad(outputs, x)


@pytest.mark.parametrize("allow_unused", [None, True, False])
def test_materialize_grads_needs_allow_unused(allow_unused: bool | None) -> None:
    def program(lib: Any, leaf: Callable[[Any], Any]) -> Callable[[], Any]:
        x, unused = leaf([1.0, 2.0]), leaf([3.0])
        loss = (x * x).sum()
        return lambda: lib.autograd.grad(
            loss, [x, unused], materialize_grads=True, allow_unused=allow_unused
        )

    assert_same_outcome(program(gv, gv_leaf), program(torch, torch_leaf))


@pytest.mark.parametrize(
    ("vectorize", "create_graph"), [(False, False), (True, True), (True, False)]
)
@pytest.mark.filterwarnings("ignore:.*torch.jit.script.*:DeprecationWarning")
def test_forward_mode_jacobian_needs_vectorize(vectorize: bool, create_graph: bool) -> None:
    def program(jacobian: Callable[..., Any], leaf: Callable[[Any], Any]) -> Callable[[], Any]:
        return lambda: jacobian(
            lambda t: t * t,
            leaf([1.0, 2.0]).detach(),
            create_graph=create_graph,
            vectorize=vectorize,
            strategy="forward-mode",
        )

    kind = assert_same_outcome(
        program(autograd.functional.jacobian, gv_leaf),
        program(torch_functional.jacobian, torch_leaf),
    )
    if kind == "ok":
        np.testing.assert_allclose(
            host(program(autograd.functional.jacobian, gv_leaf)()),
            host(program(torch_functional.jacobian, torch_leaf)()),
        )
