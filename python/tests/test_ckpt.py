# SPDX-License-Identifier: MIT
"""infinicp.CkptMeta: create, save, load, JSON, check verdicts."""

import json
import os

import pytest

import infinicp
from infinicp import Status, Verdict


def meta(world_size=8, cp=4, tp=1, cp_a2a=1, mode="p2p", layout="zigzag", seq_len=4096, heads=16, kv_heads=16,
         dim=64, dtype="bfloat16"):
    with infinicp.Topology(world_size, tp=tp, cp=cp, cp_a2a=cp_a2a) as t:
        d = infinicp.AttnDesc(dtype, batch=1, seq_len=seq_len, num_heads=heads, num_kv_heads=kv_heads,
                              head_dim=dim, layout=layout, mode=mode)
        return infinicp.CkptMeta(t, d)


def test_round_trip(tmp_path):
    m = meta()
    path = tmp_path / "cp-meta.json"
    m.save(path)
    doc = json.loads(path.read_text())
    assert doc["cp"] == 4 and doc["dp"] == 2 and doc["layout"] == "zigzag" and doc["dtype"] == "bf16"
    assert doc["format"] == "infinicp-checkpoint-cp"
    back = infinicp.CkptMeta.load(str(path))
    assert back.check(m) == (Verdict.IDENTICAL, back.check(m).reason)
    assert back.check(m).verdict == Verdict.IDENTICAL
    assert back.get("seq_len") == 4096 and back["cp"] == 4 and back["library_version"] >= 10100
    assert back.get("layout") == 1 and back.get("dtype") == 2  # enum values
    assert back.to_json() == m.to_json() == path.read_text()
    again = infinicp.CkptMeta.from_json(m.to_json())
    assert again.check(back).verdict == Verdict.IDENTICAL
    again.save(os.fsencode(str(tmp_path / "bytes-path.json")))  # bytes paths work too
    for x in (m, back, again):
        x.close()


def test_from_a_plan(tmp_path):
    def fn(r, comm):
        with infinicp.Context(num_threads=1) as ctx, infinicp.Group(ctx, comm) as g, \
                infinicp.AttnPlan(g, "float16", 2, 64, 4, 2, 8, layout="zigzag", mode="a2a") as plan, \
                infinicp.Topology(2, cp=2) as t:
            m = infinicp.CkptMeta(t, plan)
            if t.is_writer(r, "replicated"):
                m.save(tmp_path / "meta.json")
            return m.get("num_kv_heads"), m.get("mode")

    assert infinicp.run_ranks(2, fn) == [(2, 2), (2, 2)]
    assert json.loads((tmp_path / "meta.json").read_text())["mode"] == "a2a"


@pytest.mark.parametrize("changes,verdict,word", [
    (dict(), Verdict.IDENTICAL, ""),
    (dict(mode="a2a"), Verdict.COMPATIBLE, "mode"),
    (dict(layout="contiguous"), Verdict.COMPATIBLE, "layout"),
    (dict(cp=2), Verdict.COMPATIBLE, "cp"),  # dp 4 x cp 2: the same dp*cp
    (dict(world_size=16), Verdict.NEEDS_RESHARD, "dp"),
    (dict(heads=32, kv_heads=32), Verdict.INCOMPATIBLE, "num_heads"),
    (dict(dtype="float16"), Verdict.INCOMPATIBLE, "dtype"),
    (dict(world_size=16, tp=2), Verdict.INCOMPATIBLE, "tp"),
])
def test_check_verdicts(changes, verdict, word):
    saved = meta()
    current = meta(**changes)
    res = saved.check(current)
    assert res.verdict == verdict, res
    assert isinstance(res.reason, str) and word in res.reason


def test_errors(tmp_path):
    with pytest.raises(infinicp.Error) as ei:
        infinicp.CkptMeta.load(tmp_path / "missing.json")
    assert ei.value.status == Status.NOT_FOUND and "missing.json" in ei.value.message
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(infinicp.Error) as ei:
        infinicp.CkptMeta.load(bad)
    assert ei.value.status == Status.FORMAT
    doc = json.loads(meta().to_json())
    del doc["seq_len"]
    with pytest.raises(infinicp.Error, match="seq_len") as ei:
        infinicp.CkptMeta.from_json(json.dumps(doc))
    assert ei.value.status == Status.FORMAT
    tampered = meta().to_json().replace('"cp": 4', '"cp": 2')
    with pytest.raises(infinicp.Error) as ei:
        infinicp.CkptMeta.from_json(tampered)
    assert ei.value.status == Status.FORMAT
    with pytest.raises(infinicp.Error) as ei:
        meta().save(tmp_path / "no" / "such" / "dir" / "m.json")
    assert ei.value.status == Status.NOT_FOUND
    with pytest.raises(infinicp.Error) as ei:
        meta().get("order")
    assert ei.value.status == Status.INVALID_ARGUMENT
    with pytest.raises(infinicp.Error) as ei:
        meta().get("no_such_key")
    assert ei.value.status == Status.NOT_FOUND
    with pytest.raises(infinicp.Error, match="seq_len"):
        meta(seq_len=4100)  # not divisible by 2 * cp for zigzag
    with pytest.raises(infinicp.ArgumentError):
        meta().check("saved.json")
    with pytest.raises(infinicp.ArgumentError):
        infinicp.CkptMeta("topology", {})


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def test_unknown_keys_are_kept():
    """A document from a newer writer, with a key this version does not
    know, loads; the key is readable and written back."""
    doc = json.loads(meta().to_json())
    assert doc.pop("checksum") == "fnv1a64:%016x" % fnv1a64(
        json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    doc["future_key"] = 7
    doc["checksum"] = "fnv1a64:%016x" % fnv1a64(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    m = infinicp.CkptMeta.from_json(json.dumps(doc))
    assert m.get("future_key") == 7
    assert json.loads(m.to_json())["future_key"] == 7
    assert m.check(meta()).verdict == Verdict.IDENTICAL
    doc["checksum"] = "fnv1a64:0000000000000000"
    with pytest.raises(infinicp.Error, match="checksum") as ei:
        infinicp.CkptMeta.from_json(json.dumps(doc))
    assert ei.value.status == Status.FORMAT
