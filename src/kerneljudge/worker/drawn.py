"""Inputs and weights a worker draws itself from their seeds, and the fingerprint that shows two
workers drew the same.

The supervisor sends seeds, not tensors: the reference worker and the candidate's worker each
draw a trial's inputs (:meth:`kerneljudge.problem.Problem.make_inputs`: on a GPU worker's device
when the supervisor asks for it, with the CPU generator where that draw fails) and the model's
weights (:meth:`kerneljudge.problem.Problem.make_model`: on a GPU worker's device by its
generator, with the CPU generator where that construction fails), so that no tensor of them
crosses the channels. The reference worker replies with the :func:`fingerprint`
of what it drew; the candidate's worker compares its own draw's with it before it uses it, and
answers ``{"drawn": False}`` when they differ or its draw failed (a problem that draws with a
generator other than torch's, say), and the supervisor then sends the reference's tensors.

The candidate's worker is not trusted to draw honestly, and need not be: its outputs are
compared with the reference's on the reference's own draw, trial by trial and for audited
timed calls, so a worker that draws other inputs or weights (or claims a match it did not
have) only makes its own outputs wrong.

Imports only the standard library, torch and :mod:`kerneljudge.worker` modules at load;
:mod:`kerneljudge.problem` when a candidate's worker loads the problem.
"""

from __future__ import annotations

import hashlib
import secrets
import types
from typing import Any

import torch

from kerneljudge.worker.calls import align_state_dict, nbytes
from kerneljudge.worker.forward import Fault

__all__ = [
    "INPUTS_FAILED",
    "SAMPLE_ELEMENTS",
    "WEIGHTS_FAILED",
    "candidate_model",
    "construct",
    "host_tensor_attributes",
    "draw_inputs",
    "draw_model",
    "fingerprint",
    "inputs_from_seed",
    "load_problem",
    "seeded_weights",
]

#: Elements of each tensor a fingerprint reads (evenly spaced, the last one included): a draw
#: from another generator or seed differs almost everywhere, so a sample shows it.
SAMPLE_ELEMENTS = 4096
#: How a reference worker's error begins when the problem's ``get_inputs`` failed there (a
#: trial drawn from its seed): the supervisor reports it as the problem's error.
INPUTS_FAILED = "the problem's get_inputs failed"
#: How a reference worker's error begins when the problem's ``Model`` failed there (its weights
#: drawn from their seed): the supervisor reports it as the problem's error.
WEIGHTS_FAILED = "constructing the problem's Model failed"


def fingerprint(values: Any) -> str:
    """A SHA-256 hex digest of ``values``: nested lists, tuples and dicts (keys in order) of
    tensors and plain values. A tensor contributes its shape, dtype, the sum of all its bytes
    (:func:`_byte_sum`: as int64 words, one pass where it lies) and the bytes of
    :data:`SAMPLE_ELEMENTS` evenly spaced elements and its last (a GPU tensor's are gathered
    there and copied); another value its ``repr``. A tensor
    without a plain byte view (sparse, nested, quantized) makes the fingerprint unique to this
    call, so that it matches no other: such a draw is never taken as another's.

    Two draws with the same fingerprint have the same structure, shapes, dtypes, byte sums and
    sampled elements: a check for a draw that went differently (another generator, memory left
    uninitialised, one element changed), not a cryptographic hash of the contents.
    """
    h = hashlib.sha256()
    try:
        _feed(h, values)
    except (RuntimeError, TypeError, ValueError):
        return "unverifiable:" + secrets.token_hex(16)
    return h.hexdigest()


def _feed(h: Any, x: Any) -> None:
    if isinstance(x, torch.Tensor):
        h.update(f"T{tuple(x.shape)}:{x.dtype}:".encode())
        flat = x.detach().contiguous().reshape(-1)
        n = flat.numel()
        if n:
            h.update(_byte_sum(flat.view(torch.uint8)).encode())
            step = max(1, n // SAMPLE_ELEMENTS)
            sample = torch.cat([flat[::step][:SAMPLE_ELEMENTS], flat[-1:]]).contiguous().cpu()
            h.update(sample.view(torch.uint8).numpy().tobytes())
    elif isinstance(x, dict):
        h.update(b"{")
        for k, v in x.items():
            h.update(repr(k).encode())
            _feed(h, v)
        h.update(b"}")
    elif isinstance(x, list | tuple):
        h.update(b"[" if isinstance(x, list) else b"(")
        for v in x:
            _feed(h, v)
        h.update(b"]")
    else:
        h.update(f"{type(x).__name__}:{x!r};".encode())


def _byte_sum(raw: torch.Tensor) -> str:
    """``raw``'s (a 1-D contiguous uint8 tensor) bytes summed as little-endian int64 words
    modulo 2**64 (torch's integer sum wraps), then the bytes past the last whole word summed:
    a changed byte changes one of the two. int64 words because torch sums them in one
    vectorised pass: summing int32 words into an int64 converts each word first (25x slower
    on 256 MiB here). A view that starts mid-word is summed from an aligned copy."""
    whole = raw.numel() - raw.numel() % 8
    head = raw[:whole]
    try:
        words = head.view(torch.int64)
    except RuntimeError:  # its storage offset is not a multiple of 8: an aligned copy
        words = head.clone().view(torch.int64)
    tail = raw[whole:].to(torch.int64).sum() if whole < raw.numel() else 0
    return f"{int(words.sum())}+{int(tail)}"


def draw_inputs(problem: Any, seed: int, device: torch.device | None = None) -> list[Any]:
    """``problem.make_inputs(seed)`` (:meth:`kerneljudge.problem.Problem.make_inputs`); with a
    ``device``, drawn there (``on_device``).

    Raises:
        RuntimeError: no problem is loaded, or the draw raised; the message is then
            :data:`INPUTS_FAILED`, the exception's type and the first line of its message.
    """
    if problem is None:
        raise RuntimeError("no problem loaded to draw inputs from")
    try:
        if device is not None:
            return list(problem.make_inputs(seed, device, on_device=True))
        return list(problem.make_inputs(seed))
    except Exception as exc:  # noqa: BLE001 - the problem's code: its failure, in one line
        detail = next((ln for ln in str(exc).splitlines() if ln.strip()), "")
        raise RuntimeError(f"{INPUTS_FAILED}: {type(exc).__name__}: {detail}") from None


def inputs_from_seed(
    worker: Any, seed: int, expected: str | None, on_device: bool = False
) -> tuple[list[Any] | None, bool]:
    """A trial's inputs drawn in ``worker`` from ``seed``, and whether they were drawn on its
    device: ``(inputs, on_device)``.

    The reference worker: :func:`draw_inputs` of its problem, on its device when ``on_device``
    and it is a GPU, else (or when that draw raised) on the CPU. A candidate's worker
    (``expected`` is the reference's :func:`fingerprint` of its draw, ``on_device`` where the
    reference drew it): the same draw, run confined as the candidate's own code is (its patches
    of torch run there), and None for the inputs when there is no problem to draw from, the
    draw failed, or its fingerprint is not ``expected``.

    Raises:
        RuntimeError: in the reference worker, as :func:`draw_inputs`; in a candidate's
            worker, a request without ``expected``.
        Fault: in a candidate's worker, the sandbox caught the draw doing what it refuses.
    """
    device = worker.device if on_device and worker.device.type == "cuda" else None
    if worker.role == "reference":
        if device is not None:
            try:
                return draw_inputs(worker.problem, seed, device), True
            except RuntimeError:  # drawn on the CPU: that draw decides whether it fails
                pass
        return draw_inputs(worker.problem, seed), False
    if expected is None:
        raise RuntimeError("a candidate's worker draws inputs only to match the reference's")
    try:
        with worker._confined():
            drawn = draw_inputs(worker.problem, seed, device)
        return (drawn if fingerprint(drawn) == expected else None), device is not None
    except Fault:
        raise
    except Exception:  # noqa: BLE001 - any failure here: the reference's inputs are sent
        return None, device is not None


def load_problem(path: str, shape_set: str) -> Any:
    """The problem file at ``path`` at ``shape_set``
    (:meth:`kerneljudge.problem.Problem.load`, not probed: the supervisor probed it)."""
    from kerneljudge.problem import Problem

    problem = Problem.load(path, probe=False)
    problem.use_shape_set(shape_set)
    return problem


def draw_model(
    problem: Any,
    seed: int,
    init_inputs: list[Any],
    device: torch.device | str = "cpu",
    fallback: bool = True,
) -> tuple[torch.nn.Module, dict]:
    """The problem's ``Model(*init_inputs)`` with its parameters drawn from ``seed``
    (:meth:`kerneljudge.problem.Problem.make_model`) and the reply fields that describe its
    weights: ``weights`` (the :func:`fingerprint` of its state dict's items), ``weight_bytes``
    (their bytes) and ``weights_on`` (``"cuda"`` or ``"cpu"``: where they were drawn).

    Where ``device`` is a CUDA device the model is constructed there (its generator draws the
    weights, the device synchronised before the draw counts); with ``fallback`` it is
    constructed again on the CPU, as it would have been moved to the device from there, where
    that construction raised and the device still works (code that needs host tensors; out of
    memory; the memory of the attempt is given back first) or left tensors or modules that
    ``model.to`` would not move (:func:`host_tensor_attributes`). Both workers run the same
    code on the same kind of device, so they draw alike unless memory ran out in one of them:
    a candidate's worker draws where the reference's did (``weights_on``), without
    ``fallback``; the fingerprint shows any difference, and the reference's state dict is
    then sent.

    Raises:
        Fault: the sandbox caught the construction doing what it refuses.
        RuntimeError: the constructor raised on the CPU, on the device without ``fallback``,
            or on a device that no longer works after it (a CUDA error that poisons the
            context); the message is :data:`WEIGHTS_FAILED`, the exception's type and the first
            line of its message.
    """
    model, on = None, "cpu"
    dev = torch.device(device)
    try:
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # what the worker let go of before is the device's again
            failed = ""
            try:
                model, on = problem.make_model(seed, init_inputs, device=str(dev)), "cuda"
                torch.cuda.synchronize(dev)  # an asynchronous error of the draw is raised here
            except Fault:
                raise
            except Exception as exc:  # noqa: BLE001 - host tensors needed, out of memory: the CPU
                model, on, failed = None, "cpu", f"{type(exc).__name__}: {exc}"
            if model is not None and host_tensor_attributes(model):
                model, on = None, "cpu"
                failed = "Model keeps tensors or modules that .to() does not move"
            if model is None:
                torch.cuda.empty_cache()  # the attempt's memory (its traceback is gone)
                if not fallback:
                    raise RuntimeError(failed)
                _device_still_works(dev)  # else the device's fault, not the problem's: reported
        if model is None:
            model = problem.make_model(seed, init_inputs)
    except Fault:
        raise
    except Exception as exc:  # noqa: BLE001 - the problem's code: its failure, in one line
        detail = next((ln for ln in str(exc).splitlines() if ln.strip()), "")
        raise RuntimeError(f"{WEIGHTS_FAILED}: {type(exc).__name__}: {detail}") from None
    state = model.state_dict()
    weight_bytes = nbytes(list(state.values()))
    reply = {"weights": fingerprint(list(state.items())), "weight_bytes": weight_bytes}
    return model, {**reply, "weights_on": on}


def _device_still_works(dev: torch.device) -> None:
    """Return when a synchronisation of ``dev`` succeeds or there is no CUDA device to use (a
    draw on the CPU then stands in); raise its error when it does not (a sticky CUDA error:
    every later call on the context fails too)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize(dev)


def host_tensor_attributes(model: torch.nn.Module) -> bool:
    """Whether ``model`` reaches, other than through its modules' parameters, buffers and
    submodules, a tensor that is not one of its parameters or buffers or a module that is not
    one of its submodules: in an attribute, at any depth of plain lists, tuples, sets and
    dicts, or in the plain attributes of another object there (4 levels at most).
    ``model.to(device)`` leaves such tensors, and the parameters of such modules, where they
    were made. A parameter or submodule kept a second time in a plain list (an RNN's
    ``_flat_weights``) is moved with the model and does not count.

    The walk reads only plain containers and plain ``__dict__`` slots (no property, no
    ``__iter__`` or ``__getattr__`` of the model's code runs); it counts as True where it
    raises or passes :data:`WALK_LIMIT` objects (the model is then drawn on the CPU)."""
    try:
        return _reaches_outside(model)
    except Exception:  # noqa: BLE001 - an odd object: drawn on the CPU, as before
        return True


#: Objects :func:`host_tensor_attributes` looks at before it gives up (True).
WALK_LIMIT = 100_000
_SEQUENCES = (list, tuple, set, frozenset)
_LEAVES = (str, bytes, int, float, bool, type(None))


def _reaches_outside(model: torch.nn.Module) -> bool:
    modules = list(model.modules())
    known = {id(m) for m in modules}
    known.update(id(t) for m in modules for t in (*m._parameters.values(), *m._buffers.values()))
    seen: set[int] = set()
    looked = [0]

    own = ("_parameters", "_buffers", "_modules")
    for module in modules:
        attrs = _plain_dict(module)
        if attrs is None:
            return True  # nothing to read it by: as if it kept host tensors
        for name, value in list(attrs.items()):
            hook = name.endswith("_hooks") or name.startswith("_forward")
            if name not in own and not hook and _outside(value, 1, known, seen, looked):
                return True
    return False


def _outside(value: Any, depth: int, known: set[int], seen: set[int], looked: list[int]) -> bool:
    """Whether ``value`` reaches, within 4 levels, a tensor or module not among ``known``
    (ids) for :func:`_reaches_outside`; ``seen`` and ``looked`` (a one-item count) are the
    walk's. A module function: a closure that calls itself is a reference cycle.

    Raises:
        RecursionError: more than :data:`WALK_LIMIT` objects looked at.
    """
    looked[0] += 1
    if looked[0] > WALK_LIMIT:
        raise RecursionError("too many objects to look through")
    kind = type(value)  # the real type: no __class__ property of the object's code
    if id(value) in known or kind in _LEAVES:
        return False
    if issubclass(kind, torch.Tensor | torch.nn.Module):
        return True
    if depth > 4 or id(value) in seen:
        return False
    seen.add(id(value))
    walk = lambda v: _outside(v, depth + 1, known, seen, looked)  # noqa: E731
    if kind is dict:
        return any(map(walk, list(dict.values(value))[: WALK_LIMIT + 1]))
    if kind in _SEQUENCES:
        return any(map(walk, list(value)[: WALK_LIMIT + 1]))
    attrs = _plain_dict(value)
    return attrs is not None and any(map(walk, list(attrs.values())))


def _plain_dict(value: Any) -> dict[str, Any] | None:
    """``value``'s instance dictionary where its class keeps the standard one; None where it
    has none, its class defines ``__dict__`` otherwise (a property), or it is a function, a
    class or a Python module (whose names are not the model's state)."""
    if issubclass(type(value), types.FunctionType | types.ModuleType | type):
        return None
    for klass in type(value).__mro__:
        slot = klass.__dict__.get("__dict__")
        if slot is not None:
            if not isinstance(slot, types.GetSetDescriptorType):
                return None
            attrs = slot.__get__(value)
            return attrs if type(attrs) is dict else None
    return None


def construct(
    model_cls: type, init_inputs: list[Any], device: torch.device, weight_bytes: int = 0
) -> Any:
    """``model_cls(*init_inputs)`` (a candidate's ``ModelNew``, whose parameters the reference's
    replace at once, ``weight_bytes`` of them).

    On a GPU with twice ``weight_bytes`` free there, it is constructed with the device as
    torch's default first, so that the parameters it draws are drawn there (a GiB of them
    takes seconds on the CPU's one-thread generator). It is constructed on the CPU, as before
    a move to the device, where that raised (code that needs host tensors, out of memory) or
    left tensors or modules that ``model.to`` would not move (:func:`host_tensor_attributes`),
    and where the device has no such room; the CPU's exception is the one raised. The
    device's attempt leaves the generators (CPU and device) as it found them.

    Raises:
        whatever the constructor raises on the CPU; :class:`Fault` at once, from either.
    """
    if device.type == "cuda":
        torch.cuda.empty_cache()  # memory the worker let go of counts as free below
    if device.type == "cuda" and torch.cuda.mem_get_info(device)[0] >= 2 * weight_bytes:
        try:
            index = torch.cuda.current_device() if device.index is None else device.index
            with torch.random.fork_rng(devices=[torch.device("cuda", index)]), device:
                model = model_cls(*init_inputs)
            if not (isinstance(model, torch.nn.Module) and host_tensor_attributes(model)):
                return model
        except Fault:
            raise
        except Exception:  # noqa: BLE001 - constructed again on the CPU below
            pass
        model = None
        torch.cuda.empty_cache()
    return model_cls(*init_inputs)


def candidate_model(
    model_cls: type, init_inputs: list[Any], device: torch.device, state: dict[str, Any]
) -> tuple[Any, str]:
    """A candidate's ``ModelNew`` (:func:`construct`) with the reference's weights ``state``
    loaded (:func:`kerneljudge.worker.calls.align_state_dict`), and that function's note.
    ``state`` is emptied afterwards and, on a GPU, the memory its tensors held given back to
    the device (the reference's worker shares it).

    Raises:
        Fault: as :func:`construct` and ``align_state_dict``; whatever the constructor raises.
    """
    model = construct(model_cls, init_inputs, device, nbytes(list(state.values())))
    note = align_state_dict(model, state)
    state.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return model, note


def seeded_weights(worker: Any, msg: dict[str, Any], init_inputs: list[Any]) -> tuple[Any, Any]:
    """The weights of a ``setup`` request: ``(model, state)`` and the reply's fields.

    Without ``weight_seed`` in ``msg``: ``(None, msg["state_dict"])``, nothing to reply. With
    it, the weights are drawn here (:func:`draw_model`): the reference worker's model is the
    drawn ``Model`` itself, ``(model, None)``, and it replies ``weights``, ``weight_bytes``
    and ``weights_on``; a candidate's worker first loads the problem (``problem`` and
    ``shape_set`` in ``msg``, :func:`load_problem`, kept as ``worker.problem`` for drawing
    inputs), draws where the reference did (``msg["weights_on"]``; no second try elsewhere),
    and uses the drawn state ``(None, state)`` only when its fingerprint is ``msg["weights"]``,
    the reference's; otherwise, or when loading or drawing failed, the reply is
    ``{"drawn": False}`` and nothing is set up.

    Raises:
        RuntimeError: in the reference worker, as :func:`draw_model`, or no problem loaded.
        Fault: in a candidate's worker, the sandbox caught the draw doing what it refuses.
    """
    if "weight_seed" not in msg:
        return (None, dict(msg.get("state_dict", {}))), {}
    seed = int(msg["weight_seed"])
    if worker.role == "reference":
        if worker.problem is None:
            raise RuntimeError("no problem loaded to draw the weights from")
        model, reply = draw_model(worker.problem, seed, init_inputs, worker.device)
        return (model, None), reply
    try:
        with worker._confined():  # the candidate's patches of torch run here too
            worker.problem = load_problem(str(msg["problem"]), str(msg.get("shape_set", "public")))
            where = worker.device if msg.get("weights_on") == "cuda" else torch.device("cpu")
            model, reply = draw_model(worker.problem, seed, init_inputs, where, fallback=False)
            same = reply["weights"] == msg.get("weights")
            state = model.state_dict() if same else None
    except Fault:
        raise
    except Exception:  # noqa: BLE001 - any failure here: the reference's weights are sent
        worker.problem = None
        return (None, None), {"drawn": False}
    return ((None, state), reply) if same else ((None, None), {"drawn": False})
