"""Inputs and weights drawn in each worker from their seeds (kerneljudge.worker.drawn): the
fingerprint, a verdict in which no input or weight crosses from the reference worker, and the
fall-back to the reference's tensors where a draw in the candidate's worker differs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kerneljudge import Judge, JudgeConfig, Status
from kerneljudge.check.reference import ReferenceSession
from kerneljudge.worker.drawn import SAMPLE_ELEMENTS, fingerprint

LINEAR = """
import random
import torch
import torch.nn as nn

SHAPE_SETS = {{"public": {{}}}}


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n){init_noise}

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(8, 16){input_noise}]


def get_init_inputs():
    return [16]
"""
#: Draws with Python's own generator, which nothing seeds: every process draws differently.
UNSEEDED_INIT = "\n        self.fc.bias.data += random.random()"
UNSEEDED_INPUT = " + random.random()"


def _problem(tmp_path: Path, name: str, init_noise: str = "", input_noise: str = "") -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(LINEAR.format(init_noise=init_noise, input_noise=input_noise))
    cand = tmp_path / f"{name}_candidate.py"
    cand.write_text(path.read_text().replace("class Model(", "class ModelNew("))
    return path


def _judge(problem: Path, tmp_path: Path) -> Judge:
    config = JudgeConfig(
        device="cpu",
        cache_dir=tmp_path / "cache",
        timing=False,
        run_timeout_s=30.0,
        threads=1,
    )
    return Judge(problem, config)


@pytest.fixture
def relayed(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of the reference's tensors sent to a candidate: held inputs, state dicts."""
    counts = {"inputs": 0, "weights": 0}
    held, state = ReferenceSession.held_inputs, ReferenceSession.state_dict

    def held_inputs(self: ReferenceSession, *a, **kw):  # type: ignore[no-untyped-def]
        counts["inputs"] += 1
        return held(self, *a, **kw)

    def state_dict(self: ReferenceSession, *a, **kw):  # type: ignore[no-untyped-def]
        counts["weights"] += 1
        return state(self, *a, **kw)

    monkeypatch.setattr(ReferenceSession, "held_inputs", held_inputs)
    monkeypatch.setattr(ReferenceSession, "state_dict", state_dict)
    return counts


def test_fingerprint_sees_values_shapes_dtypes_and_structure() -> None:
    x = torch.randn(3 * SAMPLE_ELEMENTS + 5)
    same = x.clone()
    assert fingerprint([x, 3, {"a": 1.5}]) == fingerprint([same, 3, {"a": 1.5}])
    y = x.clone()
    y[-1] += 1.0  # the last element is always read
    assert fingerprint([x]) != fingerprint([y])
    z = x.clone()
    z[0] += 1.0
    assert fingerprint([x]) != fingerprint([z])
    assert fingerprint([x]) != fingerprint([x.double()])
    assert fingerprint([x]) != fingerprint([x.reshape(1, -1)])
    assert fingerprint([x, 3]) != fingerprint([x, 4])
    assert fingerprint([x]) != fingerprint((x,))
    assert fingerprint({"a": x}) != fingerprint({"b": x})
    # Every dtype has a fingerprint; a draw from another seed has another one.
    for t in (torch.ones(4, dtype=torch.bool), torch.arange(7), torch.randn(5).bfloat16()):
        assert fingerprint([t]) == fingerprint([t.clone()])
    torch.manual_seed(1)
    a = torch.randn(1000)
    torch.manual_seed(2)
    assert fingerprint([a]) != fingerprint([torch.randn(1000)])
    assert fingerprint([torch.empty(0)]) == fingerprint([torch.empty(0)])
    # An element between the sampled ones (every third here) still shows, in the byte sum.
    w = x.clone()
    w[1] += 1.0
    assert fingerprint([x]) != fingerprint([w])
    # A view that starts mid-word is summed as its copy is; a byte past the last whole int64
    # word, or in the middle of one, between the sampled elements still shows.
    bytes_ = torch.randint(0, 256, (8 * SAMPLE_ELEMENTS * 3 + 13,), dtype=torch.uint8)
    view = bytes_[3:]
    assert fingerprint([view]) == fingerprint([view.clone()])
    for where in (-2, 8 * SAMPLE_ELEMENTS + 5):  # neither is a sampled element
        changed = view.clone()
        changed[where] ^= 1
        assert fingerprint([view]) != fingerprint([changed])
    # A tensor without a plain byte view matches nothing, not even itself.
    sparse = torch.eye(3).to_sparse()
    assert fingerprint([sparse]) != fingerprint([sparse])


def test_seeded_draws_cross_nothing(tmp_path: Path, relayed: dict[str, int]) -> None:
    problem = _problem(tmp_path, "seeded")
    with _judge(problem, tmp_path) as judge:
        verdict = judge.evaluate(tmp_path / "seeded_candidate.py")
    assert verdict.status is Status.CORRECT, verdict.reason
    assert verdict.check is not None and verdict.check.n_passed == len(verdict.check.trials) == 5
    assert relayed == {"inputs": 0, "weights": 0}


@pytest.mark.parametrize(
    ("name", "noise", "sent"),
    [
        ("unseeded_inputs", {"input_noise": UNSEEDED_INPUT}, "inputs"),
        ("unseeded_weights", {"init_noise": UNSEEDED_INIT}, "weights"),
    ],
)
def test_a_draw_that_differs_gets_the_references_tensors(
    tmp_path: Path, relayed: dict[str, int], name: str, noise: dict[str, str], sent: str
) -> None:
    """An honest candidate of a problem that draws with an unseeded generator is judged
    correct: where its worker's draw differs from the reference's, the reference's tensors
    are sent instead (its outputs are compared on the reference's own)."""
    problem = _problem(tmp_path, name, **noise)
    with _judge(problem, tmp_path) as judge:
        verdict = judge.evaluate(tmp_path / f"{name}_candidate.py")
    assert verdict.status is Status.CORRECT, verdict.reason
    assert relayed[sent] > 0
    if sent == "weights":  # no problem in the candidate's worker to draw inputs from
        assert relayed["inputs"] == 5


def test_a_candidate_that_tampers_with_its_draw_is_compared_on_the_references(
    tmp_path: Path, relayed: dict[str, int]
) -> None:
    """A candidate that makes torch's generator draw zeros (its own inputs then differ) gets
    the reference's inputs; one that returns the zero-input answer is incorrect."""
    problem = _problem(tmp_path, "tamper")
    honest = tmp_path / "tamper_candidate.py"
    patch = "\ntorch.randn = lambda *shape, **kw: torch.zeros(*shape, **kw)\n"
    patched = tmp_path / "patched.py"
    patched.write_text(honest.read_text() + patch)
    zero = tmp_path / "zero.py"
    zero.write_text(
        honest.read_text().replace(
            "return torch.relu(self.fc(x))", "return torch.relu(self.fc(torch.zeros_like(x)))"
        )
    )
    with _judge(problem, tmp_path) as judge:
        assert judge.evaluate(patched).status is Status.CORRECT
        assert relayed["inputs"] > 0
        assert judge.evaluate(zero).status is Status.INCORRECT


def _fake_worker(role: str, problem: object, device: str) -> object:
    """What :func:`inputs_from_seed` reads of a worker: its role, problem, device and a
    confinement context (a no-op here)."""
    import contextlib
    import types

    return types.SimpleNamespace(
        role=role, problem=problem, device=torch.device(device), _confined=contextlib.nullcontext
    )


def test_make_inputs_on_device_is_the_cpu_draw_on_a_cpu_device(tmp_path: Path) -> None:
    from kerneljudge.problem import Problem

    problem = Problem.load(_problem(tmp_path, "p"), probe=False)
    (cpu,) = problem.make_inputs(3)
    (asked,) = problem.make_inputs(3, "cpu", on_device=True)
    assert torch.equal(cpu, asked)


def test_a_device_draw_that_raises_falls_back_to_the_cpu_in_the_reference(
    tmp_path: Path,
) -> None:
    """A GPU draw that raises (here: a CUDA device on a host without one) is drawn on the CPU by
    the reference worker, which says so; a candidate's worker asked for the device draw gets no
    inputs (the reference's are then sent), never a CPU draw taken for a device one."""
    from kerneljudge.problem import Problem
    from kerneljudge.worker.drawn import inputs_from_seed

    if torch.cuda.is_available():
        pytest.skip("needs a host without a usable CUDA device")
    problem = Problem.load(_problem(tmp_path, "p"), probe=False)
    reference = _fake_worker("reference", problem, "cuda")
    drawn, on_device = inputs_from_seed(reference, 5, None, on_device=True)
    assert drawn is not None and on_device is False
    assert torch.equal(drawn[0], problem.make_inputs(5)[0])
    candidate = _fake_worker("candidate", problem, "cuda")
    assert inputs_from_seed(candidate, 5, fingerprint(drawn), on_device=True) == (None, True)
    # Asked for the CPU draw, as the reference's reply said, it matches.
    again, where = inputs_from_seed(candidate, 5, fingerprint(drawn), on_device=False)
    assert again is not None and where is False and torch.equal(again[0], drawn[0])


SEEDED = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, pair):
        return x + pair[0]


def get_inputs():
    return [torch.rand(64), [torch.rand(3), torch.rand(2)]]


def get_init_inputs():
    return []
"""


def _holder(tmp_path: Path, source: str) -> object:
    from kerneljudge.problem import Problem
    from kerneljudge.worker.kept_trials import KeptTrials

    path = tmp_path / "p.py"
    path.write_text(source)
    holder = KeptTrials()
    holder.device, holder.held, holder.role = torch.device("cpu"), {}, "reference"
    holder.problem = Problem.load(path, probe=False)
    return holder


def test_inputs_drawn_on_the_device_are_held_as_their_seed_when_a_redraw_matches(
    tmp_path: Path,
) -> None:
    """Held as a Redraw (drawn again on request, nested lists included) where a second draw
    from the seed has the same fingerprint; as the tensors where it does not (a draw that is
    not a function of torch's seed alone), so the held inputs are always there to hand out."""
    from kerneljudge.worker.kept_trials import Redraw

    holder = _holder(tmp_path, SEEDED)
    drawn = holder.problem.make_inputs(5, "cpu", on_device=True)
    reply = holder.hold("0", drawn, 5, True)
    assert isinstance(holder.held["0"], Redraw) and reply["drawn_on_device"] is True
    again = holder.op_held_inputs({"key": "0", "forget": True})["inputs"]
    assert torch.equal(again[0], drawn[0]) and torch.equal(again[1][1], drawn[1][1])
    assert "0" not in holder.held

    unseeded = SEEDED.replace("torch.rand(64)", "torch.tensor([random.random()])")
    holder = _holder(tmp_path, "import random\n" + unseeded)
    drawn = holder.problem.make_inputs(5, "cpu", on_device=True)
    holder.hold("1", drawn, 5, True)
    assert not isinstance(holder.held["1"], Redraw)
    assert torch.equal(holder.held_inputs_of("1")[0], drawn[0])


def test_weights_drawn_for_a_device_that_refuses_them_are_the_cpu_draw(tmp_path: Path) -> None:
    """A construction that raises on the worker's CUDA device (here: no CUDA device at all, or
    code that needs host tensors) is done again on the CPU, the same weights as a CPU draw."""
    from kerneljudge.problem import Problem
    from kerneljudge.worker.drawn import draw_model

    path = _problem(tmp_path, "p")
    problem = Problem.load(path, probe=False)
    if torch.cuda.is_available():  # a constructor that needs host tensors raises there
        problem.module.Model.__init__ = _needs_host(problem.module.Model.__init__)
    model, reply = draw_model(problem, 5, [16], "cuda")
    cpu_model, cpu_reply = draw_model(problem, 5, [16], "cpu")
    assert not model.fc.weight.is_cuda
    assert reply == cpu_reply
    assert torch.equal(model.fc.weight, cpu_model.fc.weight)


def _needs_host(init):  # type: ignore[no-untyped-def]
    def wrapped(self, n):  # type: ignore[no-untyped-def]
        init(self, n)
        torch.empty(1).numpy()

    return wrapped


class _Plain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))


class _Table(_Plain):
    def __init__(self) -> None:
        super().__init__()
        self.table = [torch.arange(3)]  # neither a parameter nor a buffer


def test_host_tensor_attributes_sees_tensors_outside_parameters_and_buffers() -> None:
    from kerneljudge.worker.drawn import host_tensor_attributes

    assert not host_tensor_attributes(_Plain())
    assert host_tensor_attributes(_Table())
    nested = torch.nn.Sequential(_Plain(), _Plain())
    assert not host_tensor_attributes(nested)
    nested[1].lookup = {"a": torch.zeros(1)}
    assert host_tensor_attributes(nested)


def test_construct_tries_the_device_then_the_cpu_and_a_fault_goes_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``construct`` on a CUDA device: where the device attempt raises (here no CUDA device, or
    one without room) the class is constructed on the CPU and the CPU's exception is the one
    raised; a sandbox fault is raised from the first attempt, with no second one."""
    from kerneljudge.worker.drawn import construct
    from kerneljudge.worker.forward import Fault

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 40, 1 << 40))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    calls: list[str] = []

    class Made(_Plain):
        def __init__(self) -> None:
            calls.append(str(torch.get_default_device()))
            super().__init__()
            if torch.get_default_device().type == "cuda":
                torch.empty(1).numpy()  # needs a host tensor

    model = construct(Made, [], cuda, weight_bytes=4)
    assert isinstance(model, Made) and not model.fc.weight.is_cuda
    assert calls[-1] == "cpu" and len(calls) <= 2  # where CUDA is absent: the CPU at once

    class Refused(_Plain):
        def __init__(self) -> None:
            calls.append("refused")
            raise Fault("the sandbox refused")

    calls.clear()
    with pytest.raises(Fault):
        construct(Refused, [], cuda)
    assert calls == ["refused"]

    class Broken(_Plain):
        def __init__(self) -> None:
            super().__init__()
            raise ValueError(f"broken on {torch.get_default_device().type}")

    with pytest.raises(ValueError, match="broken on cpu"):
        construct(Broken, [], cuda)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8, 1 << 40))
    calls.clear()
    construct(Made, [], cuda, weight_bytes=8)  # no room for twice the weights: the CPU only
    assert calls == ["cpu"]


def test_a_candidate_model_gets_the_weights_and_the_state_is_given_up() -> None:
    from kerneljudge.worker.drawn import candidate_model

    reference = _Plain()
    state = dict(reference.state_dict())
    model, note = candidate_model(_Plain, [], torch.device("cpu"), state)
    assert note == "" and state == {}
    assert torch.equal(model.fc.weight, reference.fc.weight)


class _Listed(_Plain):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = [torch.nn.Linear(2, 2)]  # a module that .to() does not reach


class _Aliased(_Plain):
    def __init__(self) -> None:
        super().__init__()
        self.flat = [self.fc.weight, self.fc.bias]  # the parameters again: .to() moves them
        self.me = [[self]]  # the model itself, nested
        self.config = type("Config", (), {})()
        self.config.width = 4


def test_host_tensor_attributes_looks_into_nested_containers_and_objects() -> None:
    """Modules in plain lists, tensors nested deeper than one level or kept by another
    object count; the model's own parameters and modules kept again do not (an RNN's
    ``_flat_weights``)."""
    from kerneljudge.worker.drawn import host_tensor_attributes

    assert host_tensor_attributes(_Listed())
    aliased = _Aliased()
    assert not host_tensor_attributes(aliased)
    assert not host_tensor_attributes(torch.nn.LSTM(4, 4, num_layers=2))
    aliased.config.table = torch.zeros(2)
    assert host_tensor_attributes(aliased)
    del aliased.config.table
    aliased.flat.append([{"deep": torch.zeros(1)}])
    assert host_tensor_attributes(aliased)


class _Odd:
    """An object whose code raises on every read but of its plain attributes."""

    @property
    def __dict__(self):  # type: ignore[override]
        raise RuntimeError("no reading me")

    def __getattr__(self, name: str) -> object:
        raise RuntimeError(name)

    def __iter__(self):  # type: ignore[no-untyped-def]
        while True:
            yield self


def test_host_tensor_attributes_runs_none_of_the_models_code_and_ends() -> None:
    """Properties, ``__getattr__`` and ``__iter__`` of objects a model keeps are not run; a dead
    weak proxy does not raise out of it; a long plain list is looked through up to a limit,
    after which the model counts as one to draw on the CPU."""
    import time
    import weakref

    from kerneljudge.worker.drawn import WALK_LIMIT, host_tensor_attributes

    model = _Plain()
    model.odd, model.more = _Odd(), [_Odd(), {"k": _Odd()}]
    model.__dict__["dead"] = weakref.proxy(_Plain())  # its referent is gone at once
    assert not host_tensor_attributes(model)
    model.numbers = list(range(10 * WALK_LIMIT))
    started = time.monotonic()
    assert host_tensor_attributes(model)  # too many to look through: the CPU
    assert time.monotonic() - started < 30.0  # ends (it would take minutes without a limit)
    model.numbers = list(range(WALK_LIMIT // 2))
    assert not host_tensor_attributes(model)


class _Candidate:
    """A candidate's worker as ``seeded_weights`` sees it."""

    role = "candidate"

    def __init__(self, device: str) -> None:
        self.device, self.problem = torch.device(device), None

    def _confined(self):  # type: ignore[no-untyped-def]
        import contextlib

        return contextlib.nullcontext()


def test_a_candidates_worker_draws_the_weights_where_the_reference_did(tmp_path: Path) -> None:
    """The reference's reply says where it drew (``weights_on``); a candidate's worker draws
    there alone: a CPU draw is taken even on a GPU worker, and a device draw that fails
    there (no device here) is not tried again on the CPU, whose weights would differ."""
    from kerneljudge.problem import Problem
    from kerneljudge.worker.drawn import WEIGHTS_FAILED, draw_model, seeded_weights

    path = _problem(tmp_path, "p")
    problem = Problem.load(path, probe=False)
    _, reference = draw_model(problem, 5, [16], "cpu")
    assert reference["weights_on"] == "cpu"
    msg = {"weight_seed": 5, "problem": str(path), "shape_set": "public", **reference}
    (model, state), reply = seeded_weights(_Candidate("cuda"), msg, [16])
    assert model is None and reply == reference and set(state) == {"fc.weight", "fc.bias"}
    if not torch.cuda.is_available():
        (_, state), reply = seeded_weights(_Candidate("cuda"), {**msg, "weights_on": "cuda"}, [16])
        assert reply == {"drawn": False} and state is None
        with pytest.raises(RuntimeError, match=WEIGHTS_FAILED):
            draw_model(problem, 5, [16], "cuda", fallback=False)


class _Replacement:
    """A reference worker whose draw gives ``weights``."""

    def __init__(self, weights: str) -> None:
        self.weights = weights

    def request(self, op: str, timeout_s: float, **fields: object) -> dict[str, object]:
        if op == "setup":
            return {"weights": self.weights, "weight_bytes": 4, "weights_on": "cpu"}
        return {}


def test_a_replacement_reference_gives_its_own_draw_to_the_next_candidate(
    tmp_path: Path,
) -> None:
    """A reference worker that replaces one (its compile failed; before any candidate of the
    verdict is set up) may draw other weights (an unseeded constructor): the candidates set up
    after it get its fingerprint, not the first worker's."""
    from kerneljudge.problem import Problem

    problem = Problem.load(_problem(tmp_path, "p"), probe=False)
    session = ReferenceSession(problem, "public", "cpu", 5, 1, worker=_Replacement("first"))  # type: ignore[arg-type]
    assert session.weight_fields(10.0)["weights"] == "first" and session.weights_on == "cpu"
    session.worker, session._ready = _Replacement("other"), False  # type: ignore[assignment]
    assert session.weight_fields(10.0)["weights"] == "other" and not session.failed
