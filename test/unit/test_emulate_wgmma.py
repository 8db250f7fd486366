"""The emulator's warpgroup-MMA semantics (:mod:`opfuse.testing.emulator.wgmma`), checked on
hand-written kernels against examples made from the PTX ISA's text (9.7.15.5.1 "Register
Fragments and Shared Memory Matrix Layouts", the matrix descriptor format, 9.7.15.6-7
``wgmma.fence`` / ``commit_group`` / ``wait_group``), not against the emitter.

Each kernel is one block of one warpgroup (128 threads): the threads copy a shared-memory
image the test lays out with the ISA's formulas into two workgroup buffers (A, B), fence
the generic proxy, synchronize, build the descriptors from the buffers' addresses and the
LBO / SBO the test chose, run ``wgmma.mma_async.m64n16k16.f32.bf16.bf16`` and write every
thread's ``d[i]`` to ``out[thread * 8 + i]``. The operands make each element of D name its
place: ``A[m, 0] = m``, ``A[m, 1] = 1``, ``B[0, n] = 1``, ``B[1, n] = 64 n`` (the rest 0),
so ``D[m, n] = m + 64 n`` exactly, and the ISA's D figure (warp ``w``: rows ``16 w +
groupID``, ``+8`` for ``d[i]`` with ``i % 4 >= 2``; columns ``8 (i / 4) + 2
threadID_in_group + i % 2``) says which value each thread must hold.
"""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.testing.emulator import emulate, wgmma as emulate_wgmma
from opfuse.errors import OpfuseError
from opfuse.ir import make_context, parse_module
from opfuse.runtime.schedule import float32_to_bf16_bits

N = 16
S = "!llvm.struct<(" + ", ".join(["f32"] * (N // 2)) + ")>"
SA, SB = "memref<1024xbf16, 3>", "memref<256xbf16, 3>"

HOST = f"""
func.func @k(%ga: memref<1024xbf16>, %gb: memref<256xbf16>, %out: memref<1024xf32>) {{
  %c1 = arith.constant 1 : index
  %nt = arith.constant 128 : index
  gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
             threads(%tx, %ty, %tz) in (%sx = %nt, %sy = %c1, %sz = %c1)
             workgroup(%sa : {SA}, %sb : {SB}) {{
    %c8 = arith.constant 8 : index
    %c32 = arith.constant 32 : index
    %c4 = arith.constant 4 : i64
    %z = arith.constant 0.0 : f32
    %off = arith.muli %tx, %c8 : index
    %va = vector.load %ga[%off] : memref<1024xbf16>, vector<8xbf16>
    vector.store %va, %sa[%off] : {SA}, vector<8xbf16>
    %inb = arith.cmpi ult, %tx, %c32 : index
    scf.if %inb {{
      %vb = vector.load %gb[%off] : memref<256xbf16>, vector<8xbf16>
      vector.store %vb, %sb[%off] : {SB}, vector<8xbf16>
    }}
    PROXY
    BARRIER
    %pa = memref.extract_aligned_pointer_as_index %sa : {SA} -> index
    %pa64 = arith.index_cast %pa : index to i64
    %fa = arith.shrui %pa64, %c4 : i64
    %ha = arith.constant HIGH_A : i64
    %da = arith.ori %fa, %ha : i64
    %pb = memref.extract_aligned_pointer_as_index %sb : {SB} -> index
    %pb64 = arith.index_cast %pb : index to i64
    %fb = arith.shrui %pb64, %c4 : i64
    %hb = arith.constant HIGH_B : i64
    %db = arith.ori %fb, %hb : i64
    %u = llvm.mlir.undef : {S}
ZEROS
    FENCE
BODY
    gpu.terminator
  }}
  return
}}
"""
MMA = f"""    %RES = nvvm.wgmma.mma_async %DA, %db, %ACC, #nvvm.shape<m = 64, n = {N}, k = 16>,
        D [<f32>, #nvvm.wgmma_scale_out<one>], A [<bf16>, #nvvm.wgmma_scale_in<one>, <row>],
        B [<bf16>, #nvvm.wgmma_scale_in<one>, <LAYOUT_B>] : {S} -> {S}
"""
COMMIT = "    nvvm.wgmma.commit.group.sync.aligned\n"


def wait(n: int) -> str:
    return f"    nvvm.wgmma.wait.group.sync.aligned {n}\n"


def mma(res: str, acc: str, layout_b: str = "col", da: str = "da") -> str:
    return MMA.replace("RES", res).replace("ACC", acc).replace("LAYOUT_B", layout_b).replace("DA", da)


def store(res: str, base: int = 0) -> str:
    lines = [f"    %sbase_{res} = arith.constant {base} : index",
             f"    %o_{res} = arith.addi %off, %sbase_{res} : index"]
    for i in range(N // 2):
        lines += [f"    %e{i}_{res} = llvm.extractvalue %{res}[{i}] : {S}",
                  f"    %c{i}_{res} = arith.constant {i} : index",
                  f"    %p{i}_{res} = arith.addi %o_{res}, %c{i}_{res} : index",
                  f"    memref.store %e{i}_{res}, %out[%p{i}_{res}] : memref<1024xf32>"]
    return "\n".join(lines) + "\n"


ZEROS = "\n".join(
    f"    %a{i + 1} = llvm.insertvalue %z, %a{i}[{i}] : {S}".replace("%a0", "%u")
    for i in range(N // 2)
)
ACC = f"a{N // 2}"

# The operands: D[m, n] = m + 64 n.
A = np.zeros((64, 16), np.float32)
A[:, 0], A[:, 1] = np.arange(64), 1
B = np.zeros((16, N), np.float32)  # K x N
B[0, :], B[1, :] = 1, 64 * np.arange(N)


def k_major_image(x: np.ndarray, lbo: int, sbo: int, size: int) -> np.ndarray:
    """``x`` (rows along M or N, 16 along K) at the ISA's K-major no-swizzle addresses:
    byte ``(r%8)*16 + (r//8)*SBO + (k%8)*2 + (k//8)*LBO``."""
    img = np.zeros(size, np.float32)
    for r in range(x.shape[0]):
        for k in range(16):
            img[((r % 8) * 16 + (r // 8) * sbo + (k % 8) * 2 + (k // 8) * lbo) // 2] = x[r, k]
    return img


def mn_major_image(x: np.ndarray, lbo: int, sbo: int, size: int) -> np.ndarray:
    """... at the M/N-major addresses: byte ``(r%8)*2 + (r//8)*SBO + (k%8)*16 + (k//8)*LBO``."""
    img = np.zeros(size, np.float32)
    for r in range(x.shape[0]):
        for k in range(16):
            img[((r % 8) * 2 + (r // 8) * sbo + (k % 8) * 16 + (k // 8) * lbo) // 2] = x[r, k]
    return img


def high(lbo: int, sbo: int, swizzle: int = 0) -> int:
    """Descriptor bits 16-29 (LBO >> 4), 32-45 (SBO >> 4), 62-63 (swizzle mode)."""
    return ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (swizzle << 62)


def expected_fragments(d: np.ndarray) -> np.ndarray:
    """out[thread * 8 + i] = D[row, col] of d[i] as the ISA's D figure places it."""
    want = np.zeros(1024, np.float32)
    for tid in range(128):
        w, lane = tid // 32, tid % 32
        g, t = lane >> 2, lane % 4
        for i in range(N // 2):
            want[tid * 8 + i] = d[16 * w + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t + (i & 1)]
    return want


def run(body: str, *, a_img=None, b_img=None, high_a=None, high_b=None, proxy=True,
        barrier=True, fence=True):
    # A: K-major, core matrices along K 128 bytes apart, along M 256 apart
    a_img = k_major_image(A, 128, 256, 1024) if a_img is None else a_img
    b_img = k_major_image(B.T, 128, 256, 256) if b_img is None else b_img
    text = (HOST.replace("PROXY", "nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, "
                         "space = #nvvm.shared_space<cta>}" if proxy else "")
            .replace("BARRIER", "gpu.barrier" if barrier else "")
            .replace("FENCE", "nvvm.wgmma.fence.aligned" if fence else "")
            .replace("HIGH_A", str(high(128, 256) if high_a is None else high_a))
            .replace("HIGH_B", str(high(128, 256) if high_b is None else high_b))
            .replace("ZEROS", ZEROS).replace("BODY", body))
    emu = emulate.Emulator(parse_module(text, make_context()))
    out = np.full(1024, np.nan, np.float32)
    emu.run("k", [float32_to_bf16_bits(a_img), float32_to_bf16_bits(b_img), out])
    return out, emu


ONE = mma("r", ACC) + COMMIT + wait(0) + store("r")


def test_k_major_operands_and_the_d_fragment_layout():
    out, emu = run(ONE)
    np.testing.assert_array_equal(out, expected_fragments(A @ B))
    assert emu.stats.wgmma == 1
    # thread 0 holds D[0, 0], D[0, 1], D[8, 0], D[8, 1], D[0, 8] ...; thread 37 (warp 1,
    # groupID 1, threadID_in_group 1) D[17, 2] first
    assert list(out[:5]) == [0, 64, 8, 72, 512] and out[37 * 8] == 17 + 64 * 2


def test_other_strides_and_an_mn_major_b():
    """The same product with A's core matrices along M first (SBO 128, LBO 1024) and B
    stored N-major (``layoutB = row``: rows of a core matrix along K, 16 bytes along N;
    core matrices along N 128 bytes apart, along K 256)."""
    a_img = k_major_image(A, 1024, 128, 1024)
    b_img = mn_major_image(B.T, 256, 128, 256)
    out, _ = run(mma("r", ACC, "row") + COMMIT + wait(0) + store("r"), a_img=a_img, b_img=b_img,
                 high_a=high(1024, 128), high_b=high(256, 128))
    np.testing.assert_array_equal(out, expected_fragments(A @ B))


def test_a_descriptor_read_with_the_wrong_layout_gives_other_values():
    """The layout is the descriptor's, not the data's: B laid out N-major but read as
    K-major multiplies something else."""
    b_img = mn_major_image(B.T, 256, 128, 256)
    out, _ = run(ONE, b_img=b_img, high_b=high(256, 128))
    assert not np.array_equal(out, expected_fragments(A @ B))


def test_chained_mma_on_one_accumulator_and_wait_group_counts():
    """Two mma_async on one accumulator need no fence or wait between them (same shape);
    with two groups committed, wait_group 1 completes the first only."""
    body = (mma("r1", ACC) + mma("r2", "r1") + COMMIT + wait(0) + store("r2"))
    out, _ = run(body)
    np.testing.assert_array_equal(out, expected_fragments(2 * (A @ B)))
    two = mma("r1", ACC) + COMMIT + mma("r2", ACC) + COMMIT + wait(1) + store("r1")
    out, _ = run(two)
    np.testing.assert_array_equal(out, expected_fragments(A @ B))
    with pytest.raises(OpfuseError, match="before a wgmma.wait_group covers it"):
        run(two + store("r2"))


def test_reading_accumulators_before_the_wait_is_an_error():
    with pytest.raises(OpfuseError, match="before a wgmma.wait_group covers it"):
        run(mma("r", ACC) + COMMIT + store("r"))
    with pytest.raises(OpfuseError, match="before a wgmma.wait_group covers it"):
        run(mma("r", ACC) + wait(0) + store("r"))  # not committed: nothing to wait for


def test_overwriting_operands_before_the_wait_is_an_error():
    clobber = f"    vector.store %va, %sa[%off] : {SA}, vector<8xbf16>\n"
    with pytest.raises(OpfuseError, match="still being read by a wgmma.mma_async"):
        run(mma("r", ACC) + COMMIT + clobber + wait(0))
    # after the wait, another thread's write still needs a barrier first
    with pytest.raises(OpfuseError, match="since the last gpu.barrier"):
        run(mma("r", ACC) + COMMIT + wait(0) + clobber)
    run(mma("r", ACC) + COMMIT + wait(0) + "    gpu.barrier\n" + clobber + store("r"))


def test_generic_writes_need_the_proxy_fence_and_a_barrier():
    with pytest.raises(OpfuseError, match="without a fence.proxy.async"):
        run(ONE, proxy=False)
    with pytest.raises(OpfuseError, match="without a fence.proxy.async"):
        run(ONE, barrier=False)


def test_register_writes_need_wgmma_fence():
    with pytest.raises(OpfuseError, match="without a wgmma.fence"):
        run(ONE, fence=False)


def test_warpgroup_collective_and_uniform_descriptors():
    half = ("    %c64 = arith.constant 64 : index\n    %lo = arith.cmpi ult, %tx, %c64 : index\n"
            "    scf.if %lo {\n" + mma("r", ACC) + "    }\n")
    with pytest.raises(OpfuseError, match="warpgroup-collective"):
        run(half)
    skew = ("    %t64 = arith.index_cast %tx : index to i64\n"
            "    %d2 = arith.addi %da, %t64 : i64\n")
    with pytest.raises(OpfuseError, match="descriptor differs"):
        run(skew + mma("r", ACC, da="d2"))


def test_swizzled_descriptors_are_not_emulated():
    with pytest.raises(OpfuseError, match="swizzle mode 1"):
        run(ONE, high_a=high(128, 256, swizzle=1))


def test_addresses_map_to_buffers():
    """Buffers sit from byte 1024, 1024-aligned (A: 2048 bytes, so B at 3072); a
    descriptor past A's end reads outside one buffer."""
    L = type("L", (), {})()
    L.shared = [np.zeros((1, 1024), np.uint16), np.zeros((1, 256), np.uint16)]
    L.grid, L.n, L.kernel = (1, 1, 1), 128, "@k"
    st = emulate_wgmma.State(L)
    assert st.base == [1024, 3072]
    assert st.locate(np.array([1024, 1026, 3070]), "A")[0] == 0
    k, idx = st.locate(np.array([3072, 3074]), "B")
    assert k == 1 and list(idx) == [0, 1]
    with pytest.raises(OpfuseError, match="outside one workgroup buffer"):
        st.locate(np.array([3070, 3072]), "A")
