"""The timed calls' observation on a GPU: the tree digest gives the same bits on the device as
on the CPU, the loop marks and commits CUDA calls, and the kernel stamps datagrams here."""

from __future__ import annotations

import socket
import struct
import time

import pytest
import torch
from test_timer_audit import _observe

from kerneljudge.timing.sampling import observed as _observed
from kerneljudge.worker import measure
from kerneljudge.worker.stamps import KIND_TREE, output_digest, socket_pair

pytestmark = pytest.mark.gpu


def test_the_kernel_stamps_datagrams_at_their_send() -> None:
    sup, wrk = socket_pair()
    sent = time.time_ns()
    wrk.send(b"x")
    time.sleep(0.1)
    _, anc, _, _ = sup.recvmsg(16, socket.CMSG_SPACE(16))
    assert anc, "no SO_TIMESTAMPNS stamp on an AF_UNIX datagram"
    sec, nsec = struct.unpack_from("qq", anc[0][2])
    assert abs(sec * 10**9 + nsec - sent) < 50_000_000  # the send, not the read 100 ms later


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.uint8]
)
def test_the_tree_digest_is_the_same_on_the_gpu_and_the_cpu(dtype: torch.dtype) -> None:
    x = torch.randn(1001, 33) * 100
    x = (x > 0) if dtype is torch.bool else x.to(dtype)
    assert output_digest(x.cuda(), KIND_TREE) == output_digest(x, KIND_TREE)


def test_the_digest_of_a_large_output_is_fast_on_the_gpu() -> None:
    x = torch.randn(64 << 20 >> 2, device="cuda")  # 64 MiB: digested on the device
    assert output_digest(x)[0] == KIND_TREE
    output_digest(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        output_digest(x)
    per_ms = (time.perf_counter() - t0) / 5 * 1e3
    print(f"tree digest of 64 MiB on the GPU: {per_ms:.2f} ms")
    assert per_ms < 1000


@pytest.mark.parametrize(
    "nbytes",
    [
        32 << 20,
        (32 << 20) + 4,
        (32 << 20) + 3,
        (40 << 20) + 40,
        8 * 8**7 * 4 + 36,
        (5 << 29) + 44,  # 2.5 GiB: past 2^31 bytes, where torch splits a kernel's 32-bit indices
    ],
)
def test_the_fused_digest_on_the_gpu_is_the_tree_digest(nbytes: int) -> None:
    """The kernels compiled at run time give the lanes of the tree made with torch's ops, from
    an aligned and an unaligned start, and a flipped bit changes both."""
    from kerneljudge.worker.digest import digest

    g = torch.Generator(device="cuda").manual_seed(nbytes)
    base = torch.randint(0, 256, (nbytes + 1,), dtype=torch.uint8, device="cuda", generator=g)
    for raw in (base[:nbytes], base[1:]):
        assert digest(raw, fused=True) == digest(raw, fused=False)
    flipped = base[:nbytes].clone()
    flipped[nbytes // 3] ^= 4
    one, other = digest(flipped, fused=True), digest(base[:nbytes], fused=True)
    assert one[0] != other[0] and one[1] != other[1]


def test_warm_compiles_every_fused_kernel_and_digests_stay_the_same() -> None:
    """A worker's warm-up runs each of the four kernels (leaf and node, two lanes), so the first
    timed batch compiles none; the digest of a large output is the tree's after it."""
    from kerneljudge.worker import digest as tree

    tree._kernel.cache_clear()
    assert tree.warm(torch.device("cuda"))
    assert tree._kernel.cache_info().currsize == 4 and not tree._UNCOMPILED
    raw = torch.arange(40 << 20, device="cuda").to(torch.uint8)
    assert tree.digest(raw) == tree.digest(raw, fused=False)
    assert tree._kernel.cache_info().currsize == 4


def _observed_cuda_loop(fn, sets, n: int, warmup: int, keep):  # type: ignore[no-untyped-def]
    """The CPU tests' observed loop (``tests/test_timer_audit.py``) on the GPU, with an L2
    flush and freed memory poisoned as a verdict's loop has them."""
    dev = torch.device("cuda")
    flush = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
    return _observe(fn, sets, n, warmup, keep, device=dev, flush=flush, poison_bytes=1 << 20,
                    timeout_s=60)  # fmt: skip


def test_cuda_calls_are_marked_committed_and_kept() -> None:
    sets = [[torch.randn(512, 512, device="cuda")]]
    keep = lambda i: 0 if i == 5 else -1  # noqa: E731
    (times, kept, _), obs = _observed_cuda_loop(lambda x: x @ x, sets, 20, 2, keep)
    assert obs.complete()
    windows, _ = _observed(obs)
    assert all(w >= t for w, t in zip(windows, times))
    excess = sorted(w - t for w, t in zip(windows, times))
    print(f"window minus CUDA event time, median {excess[len(excess) // 2] * 1e3:.1f} us")
    rec = obs.calls[2 + 5]
    args = measure.perturb(sets[0], [True], rec.seed)
    assert torch.equal(kept[0][0], args[0] @ args[0])
    assert [output_digest(t, k) for t, (k, _) in zip(kept[0], rec.digests)] == rec.digests


def test_kept_outputs_past_the_device_room_go_to_page_locked_host_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no device room for kept outputs, each kept call's outputs are copied to the host,
    page-locked where they are 1 MiB or more, and are the outputs of that call's inputs; a slot
    kept again holds its latest call."""
    monkeypatch.setattr(measure, "SNAPSHOT_DEVICE_SHARE", 0.0)
    sets = [[torch.randn(1024, 512, device="cuda")]]  # 2 MiB outputs
    keep = {3: 0, 6: 1, 9: 0}
    (_, kept, _), obs = _observed_cuda_loop(torch.tanh, sets, 12, 2, lambda i: keep.get(i, -1))
    assert obs.complete() and set(kept) == {0, 1}
    for slot, call in ((0, 9), (1, 6)):
        (out,) = kept[slot]
        assert out.device.type == "cpu" and out.is_pinned()
        rec = obs.calls[2 + call]
        args = measure.perturb(sets[0], [True], rec.seed)
        assert torch.equal(out, torch.tanh(args[0]).cpu())
