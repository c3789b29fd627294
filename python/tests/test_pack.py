# SPDX-License-Identifier: MIT
"""infinicp.Pack: the split of a packed row, against brute force."""

import numpy as np
import pytest

import infinicp
from infinicp import Status
from refattn import doc_ids_of, visible

ROWS = {
    "three": [0, 300, 1000, 1024],
    "many_short": list(range(0, 257, 8)) + [512],
    "one": [0, 64],
    "ones": [0, 1, 2, 3, 4, 5, 6, 7, 8],
    "skewed": [0, 2, 4, 6, 200, 256],
}


def brute_work(cu, pos, causal, window):
    ids = doc_ids_of(cu)
    vis = visible(len(ids), causal, window, ids)
    return float(vis[pos].sum())


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "nomask"])
@pytest.mark.parametrize("balance", ["auto", "greedy", "contiguous"])
@pytest.mark.parametrize("row", list(ROWS))
@pytest.mark.parametrize("P", [1, 2, 4])
def test_pack_split(P, row, balance, causal, window):
    cu = ROWS[row]
    T = cu[-1]
    if T % P:
        pytest.skip("T not divisible")
    with infinicp.Pack(P, cu, causal=causal, window=window, balance=balance) as pk:
        assert (pk.cp_size, pk.seq_len, pk.num_seqs, pk.local_len) == (P, T, len(cu) - 1, T // P)
        assert list(pk.cu_seqlens) == cu
        seen = np.zeros(T, dtype=int)
        total = 0.0
        ids = doc_ids_of(cu)
        for r in range(P):
            pos = pk.positions(r)
            assert pos.dtype == np.int64 and pos.shape == (T // P,)
            seen[pos] += 1
            dp = pk.doc_positions(r)
            di = pk.doc_ids(r)
            assert di.dtype == np.int32
            np.testing.assert_array_equal(di, ids[pos])
            np.testing.assert_array_equal(dp, pos - np.asarray(cu)[ids[pos]])
            w = pk.work(r)
            assert w == brute_work(cu, pos, causal, window)
            total += w
        assert (seen == 1).all()  # every token on exactly one rank
        assert total == brute_work(cu, np.arange(T), causal, window)


def test_balances_compare():
    cu = [0, 512, 1536, 2048, 4096]
    work = {}
    for b in ("contiguous", "doc_zigzag", "greedy", "auto"):
        with infinicp.Pack(4, cu, balance=b) as pk:
            work[b] = [pk.work(r) for r in range(4)]
    assert len(set(work["doc_zigzag"])) == 1  # causal, no window: exactly even
    assert max(work["greedy"]) < max(work["contiguous"])
    assert max(work["auto"]) <= 1.01 * max(work["greedy"])
    for w in work.values():
        assert sum(w) == sum(L * (L + 1) / 2 for L in np.diff(cu))


def test_greedy_chunk():
    cu = [0, 40, 64]
    with infinicp.Pack(2, cu, balance="greedy", chunk=8) as pk:
        assert pk.chunk == 8
        for r in range(2):
            pos = pk.positions(r)
            assert all(pos[i] % 8 == 0 for i in range(0, len(pos), 8))


@pytest.mark.parametrize("kw,words", [
    (dict(cp_size=2, cu_seqlens=[0, 10, 10, 32]), "cu_seqlens"),
    (dict(cp_size=2, cu_seqlens=[0, 20, 12, 32]), "cu_seqlens"),
    (dict(cp_size=2, cu_seqlens=[1, 10, 32]), "cu_seqlens"),
    (dict(cp_size=2, cu_seqlens=[0]), "num_seqs"),
    (dict(cp_size=2, cu_seqlens=[]), "num_seqs"),
    (dict(cp_size=3, cu_seqlens=[0, 10, 32]), "cp_size|T"),
    (dict(cp_size=0, cu_seqlens=[0, 32]), "cp_size"),
    (dict(cp_size=2, cu_seqlens=[0, 32], window=-1), "window"),
    (dict(cp_size=2, cu_seqlens=[0, 32], balance="greedy", chunk=5), "chunk"),
    (dict(cp_size=2, cu_seqlens=[0, 6, 32], balance="doc_zigzag"), "multiple|2P|document"),
])
def test_pack_errors(kw, words):
    with pytest.raises(infinicp.Error) as ei:
        infinicp.Pack(**kw)
    assert ei.value.status == Status.INVALID_ARGUMENT
    assert __import__("re").search(words, ei.value.message), ei.value.message


def test_pack_argument_errors():
    with pytest.raises(infinicp.ArgumentError, match="balance"):
        infinicp.Pack(2, [0, 32], balance="fair")
    with pytest.raises(infinicp.ArgumentError, match="cu_seqlens"):
        infinicp.Pack(2, ["a", "b"])
    with infinicp.Pack(2, [0, 32]) as pk:
        for bad in (-1, 2):
            with pytest.raises(infinicp.Error, match="rank") as ei:
                pk.positions(bad)
            assert ei.value.status == Status.INVALID_ARGUMENT
            with pytest.raises(infinicp.Error, match="rank"):
                pk.work(bad)


def test_pack_shard_and_gather():
    P = 4
    cu = [0, 3, 30, 31, 64]
    x = np.arange(64 * 3, dtype=np.float32).reshape(1, 64, 3)

    def fn(r, comm):
        with infinicp.Context(num_threads=1) as ctx, infinicp.Group(ctx, comm) as g, \
                infinicp.Pack(P, cu) as pk:
            part = pk.shard(x, r, dim=1)
            np.testing.assert_array_equal(part, x[:, pk.positions(r)])
            np.testing.assert_array_equal(pk.gather(g, part, dim=1), x)
            np.testing.assert_array_equal(g.gather(part, pk, dim=1), x)
            with pytest.raises(infinicp.Error, match="one"):
                pk.shard(np.zeros((2, 64, 3), np.float32), r, dim=1)
            with pytest.raises(infinicp.Error, match="tokens"):
                pk.shard(np.zeros((1, 32, 3), np.float32), r, dim=1)
            return True

    assert infinicp.run_ranks(P, fn) == [True] * P
