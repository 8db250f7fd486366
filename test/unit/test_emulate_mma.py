"""The emulator's tensor-core and cp.async semantics (:mod:`opfuse.testing.emulator.mma`),
each checked on its own against hand-made examples read off the PTX ISA's tables and
descriptions (9.7.14.5.7/8 "Matrix Fragments for mma.m16n8k8 / m16n8k16", 9.7.14.5.15
ldmatrix, 9.7.9.25 cp.async), not against the emitters that use them.

The kernels are written by hand: one block, one warp (32 threads) unless said otherwise;
each lane reads what it holds (fragment registers, row addresses) from global memory at
``lane * stride`` and writes what it got back the same way, so every expectation is a
statement about one lane's registers, as the ISA's figures make them.
"""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.testing.emulator import emulate, mma as emulate_mma
from opfuse.errors import OpfuseError
from opfuse.ir import make_context, parse_module

HOST = """
func.func @k(ARGS) {
  %c1 = arith.constant 1 : index
  %nt = arith.constant THREADS : index
  %nb = arith.constant BLOCKS : index
  gpu.launch blocks(%bx, %by, %bz) in (%gx = %nb, %gy = %c1, %gz = %c1)
             threads(%tx, %ty, %tz) in (%sx = %nt, %sy = %c1, %sz = %c1) WORKGROUP {
    %c0 = arith.constant 0 : index
BODY
    gpu.terminator
  }
  return
}
"""


def run(args: dict, body: str, *, shared: str = "", threads: int = 32, blocks: int = 1,
        racecheck: bool = True) -> tuple[dict, emulate.Emulator]:
    """Run ``body`` with ``args`` (name -> (mlir type, array)); returns the arrays after."""
    text = (
        HOST.replace("ARGS", ", ".join(f"%{n}: {t}" for n, (t, _) in args.items()))
        .replace("THREADS", str(threads))
        .replace("BLOCKS", str(blocks))
        .replace("WORKGROUP", f"workgroup(%sm : {shared})" if shared else "")
        .replace("BODY", body)
    )
    emu = emulate.Emulator(parse_module(text, make_context()), racecheck=racecheck)
    arrays = {n: a.copy() for n, (_, a) in args.items()}
    emu.run("k", list(arrays.values()))
    return arrays, emu


# ----- ldmatrix -------------------------------------------------------------------------

SMEM16 = "memref<256xf16, 3>"
LDM = """
    %row = memref.load %addr[%tx] : memref<32xindex>
    %f = nvgpu.ldmatrix %sm[%row] {numTiles = COUNT : i32, transpose = TRANS} : SMEM16 -> vector<COUNTx2xf16>
    FILL
    OUTS
"""


def _ldmatrix(count: int, trans: bool, addr: np.ndarray, smem: np.ndarray) -> np.ndarray:
    """Shared memory filled from ``smem`` (one element per thread and pass), then the
    ldmatrix; returns each lane's registers, shape (32, count, 2)."""
    fill = "\n".join(
        f"""    %i{p} = affine.apply affine_map<(d0) -> (d0 + {32 * p})>(%tx)
    %v{p} = memref.load %src[%i{p}] : memref<256xf16>
    memref.store %v{p}, %sm[%i{p}] : SMEM16"""
        for p in range(8)
    )
    outs = "\n".join(
        f"""    %o{j} = affine.apply affine_map<(d0) -> (d0 * {2 * count} + {2 * j})>(%tx)
    %r{j} = vector.extract %f[{j}] : vector<2xf16> from vector<{count}x2xf16>
    vector.store %r{j}, %out[%o{j}] : memref<{64 * count}xf16>, vector<2xf16>"""
        for j in range(count)
    )
    # the fill is written by all threads and read by others: a barrier in between
    body = (
        LDM.replace("FILL", "").replace("OUTS", outs).replace("COUNT", str(count))
        .replace("TRANS", str(trans).lower())
    )
    body = fill + "\n    gpu.barrier\n" + body
    body = body.replace("SMEM16", SMEM16)
    args = {
        "addr": ("memref<32xindex>", addr.astype(np.int64)),
        "src": ("memref<256xf16>", smem.astype(np.float16)),
        "out": (f"memref<{64 * count}xf16>", np.zeros(64 * count, np.float16)),
    }
    out, _ = run(args, body, shared=SMEM16)
    return out["out"].reshape(32, count, 2)


def test_ldmatrix_x1_gives_each_lane_two_elements_of_row_lane_div_4():
    m = np.arange(64)  # an 8x8 matrix M[r][c] = 8r + c, rows 8 elements apart
    addr = np.zeros(32, np.int64)
    addr[:8] = np.arange(8) * 8  # threads 0-7 give the row addresses (x1)
    got = _ldmatrix(1, False, addr, np.concatenate([m, np.zeros(192)]))
    # PTX ISA, ldmatrix fragment figure: lane 0 holds row 0 cols 0,1; lane 1 cols 2,3;
    # lane 4 row 1 cols 0,1; lane 31 row 7 cols 6,7
    assert list(got[0, 0]) == [0, 1]
    assert list(got[1, 0]) == [2, 3]
    assert list(got[4, 0]) == [8, 9]
    assert list(got[5, 0]) == [10, 11]
    assert list(got[31, 0]) == [62, 63]


def test_ldmatrix_trans_gives_each_lane_a_column_pair():
    m = np.arange(64)
    addr = np.zeros(32, np.int64)
    addr[:8] = np.arange(8) * 8
    got = _ldmatrix(1, True, addr, np.concatenate([m, np.zeros(192)]))
    # .trans: lane 0 holds (0,0) and (1,0); lane 1 (2,0) (3,0); lane 4 (0,1) (1,1);
    # lane 31 (6,7) (7,7)
    assert list(got[0, 0]) == [0, 8]
    assert list(got[1, 0]) == [16, 24]
    assert list(got[4, 0]) == [1, 9]
    assert list(got[31, 0]) == [55, 63]


def test_ldmatrix_x4_rows_come_from_each_lanes_own_address():
    """Matrix j's rows are the addresses of lanes 8j..8j+7, in lane order, wherever they
    point: here lane 8j + r points at row 7 - r of a 32-row table (row R = 8 elements
    16*R .. 16*R + 7 at stride 16: every row 16-byte aligned)."""
    table = np.zeros(256)
    for R in range(16):
        table[16 * R : 16 * R + 8] = R * 100 + np.arange(8)
    lane = np.arange(32)
    rows = ((lane // 8) * 4 + 7 - lane % 8) % 16  # matrix j: table rows 4j+7 down to 4j
    got = _ldmatrix(4, False, rows * 16, table)
    # lane 0 reads matrix j's row 0 = address of lane 8j = table row 4j + 7, cols 0 and 1
    for j in range(4):
        R = (4 * j + 7) % 16
        assert list(got[0, j]) == [R * 100, R * 100 + 1]
    # lane 13 (row 3, cols 2, 3) of matrix 2: lane 19's address = table row 8 + 4
    assert list(got[13, 2]) == [1202, 1203]


def test_ldmatrix_needs_aligned_rows():
    addr = np.arange(32) * 8 + 1
    with pytest.raises(OpfuseError, match="not 16-byte aligned"):
        _ldmatrix(1, False, addr % 200, np.zeros(256))


def test_ldmatrix_bank_conflicts_are_counted():
    """Rows 64 bytes apart (an unpadded 32-wide f16 tile): rows r and r+2 share a bank
    group, 4 distinct rows per group: 4 wavefronts for the one matrix. Rows 80 bytes apart
    (padded to 40): 8 different groups, one wavefront."""
    for stride, waves in ((32, 4), (40, 1)):
        addr = np.zeros(32, np.int64)
        addr[:8] = np.arange(8) * stride
        body = LDM.replace("FILL", "").replace("OUTS", "").replace("COUNT", "1")
        body = body.replace("TRANS", "false").replace("SMEM16", "memref<512xf16, 3>")
        _, emu = run({"addr": ("memref<32xindex>", addr)}, body, shared="memref<512xf16, 3>")
        assert emu.stats.ldmatrix_matrices == 1
        assert emu.stats.ldmatrix_wavefronts == waves, stride


# ----- mma.sync ---------------------------------------------------------------------------

MMA = """
    ALOADS
    BLOADS
    %z = arith.constant 0.0 : f32
    %c = memref.load %cin[%tx] : memref<32xf32>
    %d = nvvm.mma.sync A[AREGS] B[BREGS] C[%z, %z, %z, %c]
      {layoutA = #nvvm.mma_layout<row>, layoutB = #nvvm.mma_layout<col>,
       multiplicandAPtxType = #nvvm.mma_type<PTX>, multiplicandBPtxType = #nvvm.mma_type<PTX>,
       shape = #nvvm.shape<m = 16, n = 8, k = K>} : (OPTYPE, OPTYPE, f32) -> !llvm.struct<(f32, f32, f32, f32)>
    STORES
"""


def _mma(ptx: str, a_regs: np.ndarray, b_regs: np.ndarray, c3=None) -> np.ndarray:
    """Each lane's A and B registers as given (f16: pairs of halves; bf16/tf32: 32-bit
    patterns), C = 0 except each lane's c3 (``c3``); returns each lane's D (32, 4)."""
    k = 8 if ptx == "tf32" else 16
    if ptx == "f16":
        optype = "vector<2xf16>"
        load = lambda name, j, n: (  # noqa: E731
            f"%{name}o{j} = affine.apply affine_map<(d0) -> (d0 * {2 * n} + {2 * j})>(%tx)\n"
            f"    %{name}{j} = vector.load %{name}in[%{name}o{j}] : memref<{64 * n}xf16>, vector<2xf16>"
        )
        a_arg = ("memref<256xf16>", a_regs.astype(np.float16).reshape(-1))
        b_arg = ("memref<128xf16>", b_regs.astype(np.float16).reshape(-1))
    else:
        optype = "i32"
        load = lambda name, j, n: (  # noqa: E731
            f"%{name}o{j} = affine.apply affine_map<(d0) -> (d0 * {n} + {j})>(%tx)\n"
            f"    %{name}{j} = memref.load %{name}in[%{name}o{j}] : memref<{32 * n}xi32>"
        )
        a_arg = ("memref<128xi32>", a_regs.astype(np.int32).reshape(-1))
        b_arg = ("memref<64xi32>", b_regs.astype(np.int32).reshape(-1))
    stores = "\n".join(
        f"""%e{i} = llvm.extractvalue %d[{i}] : !llvm.struct<(f32, f32, f32, f32)>
    %q{i} = affine.apply affine_map<(d0) -> (d0 * 4 + {i})>(%tx)
    memref.store %e{i}, %out[%q{i}] : memref<128xf32>"""
        for i in range(4)
    )
    body = (
        MMA.replace("ALOADS", "\n    ".join(load("a", j, 4) for j in range(4)))
        .replace("BLOADS", "\n    ".join(load("b", j, 2) for j in range(2)))
        .replace("AREGS", ", ".join(f"%a{j}" for j in range(4)))
        .replace("BREGS", ", ".join(f"%b{j}" for j in range(2)))
        .replace("PTX", ptx).replace("OPTYPE", optype).replace("STORES", stores)
        .replace(" K>", f" {k}>")
    )
    args = {
        "ain": a_arg,
        "bin": b_arg,
        "cin": ("memref<32xf32>", np.zeros(32, np.float32) if c3 is None else c3),
        "out": ("memref<128xf32>", np.zeros(128, np.float32)),
    }
    out, emu = run(args, body)
    assert emu.stats.mma == 1
    return out["out"].reshape(32, 4)


def _bits16(x: float, dtype) -> int:
    if dtype == "bf16":
        return int(np.float32(x).view(np.uint32)) >> 16
    return int(np.float16(x).view(np.uint16))


def test_mma_m16n8k16_f16_places_elements_as_the_tables_say():
    """Hand-made from the m16n8k16 tables: lane 5 (groupID 1, threadID_in_group 1) holds
    A[9][3] in a3 (row groupID + 8, col 2*1 + 1): register 1, second half; lane 21
    (groupID 5, thread 1) holds B[3][5] in b1 (row 2*1 + 1, col 5): register 0, second
    half. D = A B is zero except D[9][5] = 1.5 * -2 = -3, which the C table puts in lane
    6 (groupID 1, thread 2) c3 (row 1 + 8, col 2*2 + 1)."""
    a = np.zeros((32, 4, 2))
    b = np.zeros((32, 2, 2))
    a[5, 1, 1] = 1.5
    b[21, 0, 1] = -2.0
    d = _mma("f16", a, b)
    want = np.zeros((32, 4))
    want[6, 3] = -3.0
    np.testing.assert_array_equal(d, want)


def test_mma_m16n8k16_f16_upper_half_of_k():
    """A[0][8] is a4 of lane 0 (col 2*0 + 0 + 8: register 2, first half); B[8][0] is b2
    of lane 0 (row 0 + 8: register 1, first half); D[0][0] = 2 * 3 = 6 is c0 of lane 0."""
    a = np.zeros((32, 4, 2))
    b = np.zeros((32, 2, 2))
    a[0, 2, 0] = 2.0
    b[0, 1, 0] = 3.0
    d = _mma("f16", a, b)
    assert d[0, 0] == 6.0 and np.count_nonzero(d) == 1


def test_mma_m16n8k16_bf16_packs_element_0_in_the_low_half():
    """bf16 registers are 32-bit: element a_{2r} in bits 0-15, a_{2r+1} in bits 16-31.
    The f16 example again, as bit patterns."""
    a = np.zeros((32, 4), np.int64)
    b = np.zeros((32, 2), np.int64)
    a[5, 1] = _bits16(1.5, "bf16") << 16  # a3: the high half of register 1
    b[21, 0] = _bits16(-2.0, "bf16") << 16  # b1: the high half of register 0
    d = _mma("bf16", a.astype(np.uint32).view(np.int32), b.astype(np.uint32).view(np.int32))
    want = np.zeros((32, 4))
    want[6, 3] = -3.0
    np.testing.assert_array_equal(d, want)


def test_mma_m16n8k8_tf32_places_elements_as_the_tables_say():
    """m16n8k8 .tf32 tables: A[9][5] is a3 of lane 5 (row groupID + 8, col thread + 4:
    groupID 1, thread 1); B[5][2] is b1 of lane 9 (row thread + 4, col groupID: thread
    1, groupID 2); D[9][2] is c2 of lane 5 (row 1 + 8, col 2*1). C's c3 adds in place:
    lane 0's c3 (D[8][1]) = 0.25."""
    a = np.zeros((32, 4), np.float32)
    b = np.zeros((32, 2), np.float32)
    a[5, 3] = 1.5
    b[9, 1] = -2.0
    c3 = np.zeros(32, np.float32)
    c3[0] = 0.25
    d = _mma("tf32", a.view(np.int32), b.view(np.int32), c3)
    want = np.zeros((32, 4))
    want[5, 2] = -3.0
    want[0, 3] = 0.25
    np.testing.assert_array_equal(d, want)


def test_mma_tf32_reads_19_bits():
    """The tensor core ignores the low 13 mantissa bits of a TF32 operand."""
    a = np.zeros((32, 4), np.float32)
    b = np.zeros((32, 2), np.float32)
    a[0, 0] = 1.0 + 2.0**-12  # below TF32's 10 mantissa bits: read as 1.0
    b[0, 0] = 1.0
    d = _mma("tf32", a.view(np.int32), b.view(np.int32))
    assert d[0, 0] == 1.0


def test_mma_full_product_matches_numpy():
    """Random A, B spread over the lanes by the ISA's formulas (written here again, from
    the tables): D gathered by the C formula equals A @ B."""
    rng = np.random.default_rng(0)
    A = rng.integers(-4, 5, (16, 16)).astype(np.float16)
    B = rng.integers(-4, 5, (16, 8)).astype(np.float16)
    a = np.zeros((32, 4, 2))
    b = np.zeros((32, 2, 2))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(8):
            row = g if i in (0, 1, 4, 5) else g + 8
            col = 2 * t + (i & 1) + (8 if i >= 4 else 0)
            a[lane, i // 2, i % 2] = A[row, col]
        for i in range(4):
            b[lane, i // 2, i % 2] = B[2 * t + (i & 1) + (8 if i >= 2 else 0), g]
    d = _mma("f16", a, b)
    D = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(4):
            D[g + (8 if i >= 2 else 0), 2 * t + (i & 1)] = d[lane, i]
    np.testing.assert_array_equal(D, A.astype(np.float64) @ B.astype(np.float64))


def test_tf32_rounding_is_nearest_ties_away():
    one = np.float32(1.0)
    ulp = 2.0**-10
    x = np.array([1 + 2.0**-11, 1 + 2.0**-12, -(1 + 2.0**-11), 1 + 3 * 2.0**-11], np.float32)
    got = emulate_mma.tf32_rna(x).view(np.float32)
    np.testing.assert_array_equal(got, [one + ulp, one, -(one + ulp), one + 2 * ulp])


def test_bitcast_puts_element_0_in_the_low_bits():
    pair = np.array([[1.0, -2.0]], np.float16)
    bits = emulate_mma.bitcast_lanes(pair, "f16", "i32")
    assert int(bits[0, 0]) & 0xFFFF == int(np.float16(1.0).view(np.uint16))
    assert (int(bits[0, 0]) >> 16) & 0xFFFF == int(np.float16(-2.0).view(np.uint16))
    back = emulate_mma.bitcast_lanes(bits, "i32", "bf16")
    assert back.shape == (1, 2)


# ----- cp.async ---------------------------------------------------------------------------

SMEM32 = "memref<64xf32, 3>"
COPY = """
    %four = arith.constant 4 : index
    %n = memref.load %cnt[%tx] : memref<8xindex>
    %at = affine.apply affine_map<(d0) -> (d0 * 4)>(%tx)
    %t0 = nvgpu.device_async_copy %src[%at], %sm[%at], 4, %n : memref<32xf32> to SMEM32
    %g0 = nvgpu.device_async_create_group %t0
    AFTER
"""


def _copy(after: str, counts=(4,) * 8, racecheck: bool = True):
    args = {
        "src": ("memref<32xf32>", np.arange(32, dtype=np.float32) + 1),
        "cnt": ("memref<8xindex>", np.array(counts, np.int64)),
        "out": ("memref<64xf32>", np.full(64, -1, np.float32)),
    }
    body = COPY.replace("AFTER", after).replace("SMEM32", SMEM32)
    out, _ = run(args, body, shared=SMEM32, threads=8, racecheck=racecheck)
    return out["out"]


READ_OWN = """
    %o = affine.apply affine_map<(d0) -> (d0 * 4 + 3)>(%tx)
    %v = memref.load %sm[%o] : SMEM32
    memref.store %v, %out[%o] : memref<64xf32>
"""


def test_cp_async_lands_at_wait_group_and_zero_fills_past_src_size():
    """cp.async with src-size < cp-size: the rest of the 16 bytes are zeros (thread 2
    copies 1 element of 4, thread 5 none)."""
    counts = [4, 4, 1, 4, 4, 0, 4, 4]
    after = "nvgpu.device_async_wait %g0 {numGroups = 0 : i32}\n" + READ_OWN
    out = _copy(after.replace("SMEM32", SMEM32), counts)
    last = out[[3, 7, 11, 15]]  # element 3 of threads 0..3
    np.testing.assert_array_equal(last, [4, 8, 0, 16])
    assert out[5 * 4 + 3] == 0


def test_reading_a_copy_in_flight_is_a_race():
    """Without a wait the copy may not have landed: even the issuing thread must not read."""
    with pytest.raises(OpfuseError, match="still in flight"):
        _copy(READ_OWN.replace("SMEM32", SMEM32))


def test_without_the_race_check_an_unwaited_copy_has_not_landed():
    out = _copy(READ_OWN.replace("SMEM32", SMEM32), racecheck=False)
    assert out[3] == 0  # shared memory's initial value, not the copied 4.0


def test_wait_group_n_leaves_the_n_newest_groups_in_flight():
    """Two groups: wait_group 1 completes the first (read back fine); the second, into
    the next 4 elements... is still in flight."""
    second = """
    %at2 = affine.apply affine_map<(d0) -> (d0 * 4 + 32)>(%tx)
    %src2 = affine.apply affine_map<(d0) -> (d0 * 4)>(%tx)
    %t1 = nvgpu.device_async_copy %src[%src2], %sm[%at2], 4 : memref<32xf32> to SMEM32
    %g1 = nvgpu.device_async_create_group %t1
    nvgpu.device_async_wait %g1 {numGroups = 1 : i32}
    """
    out = _copy((second + READ_OWN).replace("SMEM32", SMEM32))
    assert out[3] == 4.0
    bad = second + READ_OWN.replace("d0 * 4 + 3", "d0 * 4 + 35")
    with pytest.raises(OpfuseError, match="still in flight"):
        _copy(bad.replace("SMEM32", SMEM32))


READ_NEXT = """
    nvgpu.device_async_wait %g0 {numGroups = 0 : i32}
    BARRIER
    %o = affine.apply affine_map<(d0) -> (((d0 + 1) mod 8) * 4)>(%tx)
    %v = memref.load %sm[%o] : SMEM32
    memref.store %v, %out[%o] : memref<64xf32>
"""


def test_another_threads_copy_is_visible_after_wait_and_barrier():
    out = _copy(READ_NEXT.replace("BARRIER", "gpu.barrier").replace("SMEM32", SMEM32))
    np.testing.assert_array_equal(out[[0, 4, 8, 12]], [1, 5, 9, 13])
    with pytest.raises(OpfuseError, match="read-after-write"):  # waited, no barrier
        _copy(READ_NEXT.replace("BARRIER", "").replace("SMEM32", SMEM32))


def test_refilling_a_buffer_others_still_read_is_a_race():
    """A copy issued over an element another thread read since the last barrier could
    land before that read on a GPU (a stage refilled without the barrier)."""
    body = """
    %o = affine.apply affine_map<(d0) -> (((d0 + 1) mod 8) * 4)>(%tx)
    %v = memref.load %sm[%o] : SMEM32
    """
    with pytest.raises(OpfuseError, match="write-after-read"):
        args = {
            "src": ("memref<32xf32>", np.zeros(32, np.float32)),
            "cnt": ("memref<8xindex>", np.full(8, 4, np.int64)),
        }
        body = body + COPY.replace("AFTER", "").replace(
            "%n = memref.load %cnt[%tx] : memref<8xindex>", "%n = arith.constant 4 : index"
        )
        run({"src": args["src"]}, body.replace("SMEM32", SMEM32), shared=SMEM32, threads=8)


def test_warp_collective_ops_reject_partial_warps():
    body = """
    %half = arith.constant 16 : index
    %p = arith.cmpi ult, %tx, %half : index
    scf.if %p {
      %f = nvgpu.ldmatrix %sm[%c0] {numTiles = 1 : i32, transpose = false} : SMEM16 -> vector<1x2xf16>
    }
    """.replace("SMEM16", SMEM16)
    with pytest.raises(OpfuseError, match="warp-collective"):
        run({}, body, shared=SMEM16)
