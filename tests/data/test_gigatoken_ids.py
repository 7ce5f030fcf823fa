"""gigatoken's batch ids without importing awkward (`mftk.data.gigatoken_ids`): same ids, safe fallback.

Each check runs in a fresh interpreter, where awkward is not imported yet (in this test process another
test may have imported it, and then the stand-in is never used).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TEXTS = ["Hello world", "", "  spaces  ", "Ünïcödé 東京 😀", "<|endoftext|> inside", "a" * 3000, "x"]

PROBE = r"""
import json, sys
import numpy as np
import gigatoken
from mftk.data import gigatoken_ids as G

texts = json.loads(sys.argv[2])
tok = gigatoken.Tokenizer.from_json(open(sys.argv[1], "rb").read())
out = {}
flat, counts = G.encode_batch_arrays(tok.encode_batch, texts)
out["stand_in_ids"] = [flat.tolist(), counts.tolist()]
out["awkward_after_stand_in"] = "awkward" in sys.modules
out["usable"] = G._state["usable"]
MODE = sys.argv[3]
if MODE == "asks_more":  # a gigatoken that builds its result another way: the stand-in cannot serve it
    def batch(texts):
        import awkward as ak
        return ak.Array(ak.from_iter([tok.encode(t).tolist() for t in texts]))
    flat2, counts2 = G.encode_batch_arrays(batch, texts)
elif MODE == "wrong_shape":  # unflatten receives something else than the ids and their counts
    def batch(texts):
        import awkward as ak
        ids = np.concatenate([tok.encode(t) for t in texts])
        return ak.unflatten(ids, np.array([len(ids)]))
    flat2, counts2 = G.encode_batch_arrays(batch, texts)
else:
    import awkward  # the real one: the ordinary path
    flat2, counts2 = G.encode_batch_arrays(tok.encode_batch, texts)
out["second_ids"] = [np.asarray(flat2).tolist(), np.asarray(counts2).tolist()]
out["stand_in_left"] = type(sys.modules.get("awkward")).__name__ == "_AwkwardStandIn"
out["usable_after"] = G._state["usable"]
print(json.dumps(out))
"""


def _probe(tokenizer_file, mode):
    out = subprocess.run([sys.executable, "-c", PROBE, str(tokenizer_file), json.dumps(TEXTS), mode],
                         capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _reference(tokenizer_file):
    """Each text on its own with gigatoken's single-text encode (no batch, no awkward involved)."""
    import gigatoken

    tok = gigatoken.Tokenizer.from_json(Path(tokenizer_file).read_bytes())
    ids = [tok.encode(t).tolist() for t in TEXTS]
    return [[i for row in ids for i in row], [len(row) for row in ids]]


def test_stand_in_gives_the_ids_of_real_awkward(tokenizer_file):
    got = _probe(tokenizer_file, "real")
    want = _reference(tokenizer_file)
    assert got["stand_in_ids"] == want
    assert got["second_ids"] == want  # through the real awkward, imported afterwards
    assert got["awkward_after_stand_in"] is False and got["usable"] is True
    assert got["stand_in_left"] is False


def test_a_gigatoken_that_asks_for_more_falls_back_to_real_awkward(tokenizer_file):
    got = _probe(tokenizer_file, "asks_more")
    want = _reference(tokenizer_file)
    assert got["second_ids"] == want
    assert got["usable_after"] is False and got["stand_in_left"] is False


def test_a_result_of_another_shape_falls_back(tokenizer_file):
    got = _probe(tokenizer_file, "wrong_shape")
    flat, counts = _reference(tokenizer_file)
    assert got["second_ids"] == [flat, [len(flat)]]  # what the real awkward makes of that call
    assert got["usable_after"] is False and got["stand_in_left"] is False


DIRECT = r"""
import json, os, sys
from mftk.data import gigatoken_ids as G

texts = json.loads(sys.argv[2])
data = open(sys.argv[1], "rb").read()
out = {}
tok = G.from_json(data)
out["direct"] = type(tok).__name__ == "_Direct"
flat, counts = G.encode_batch_arrays(tok.encode_batch, texts)
out["ids"] = [flat.tolist(), counts.tolist()]
out["package_imported"] = "gigatoken" in sys.modules
out["parallel_here"] = G._may_run_parallel()
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # a forked child: gigatoken's own rule runs nothing on the thread pool there
    os.write(w, b"1" if G._may_run_parallel() else b"0")
    os._exit(0)
os.waitpid(pid, 0)
out["parallel_in_child"] = os.read(r, 1) == b"1"
import gigatoken  # the package afterwards: it imports as usual and shares the compiled module
out["package_tokenizer"] = type(G.from_json(data)).__name__
out["package_ids"] = [gigatoken.Tokenizer.from_json(data).encode(t).tolist() for t in texts]
print(json.dumps(out))
"""


def test_compiled_module_alone_gives_the_packages_ids(tokenizer_file):
    """`from_json` loads gigatoken's compiled tokenizer without the package's Python layer; the package,
    imported afterwards, works and gives the same ids, and the thread pool is not used after a fork."""
    out = subprocess.run([sys.executable, "-c", DIRECT, str(tokenizer_file), json.dumps(TEXTS)], capture_output=True,
                         text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    want = _reference(tokenizer_file)
    assert got["direct"] and not got["package_imported"] and got["ids"] == want
    assert got["parallel_here"] is True and got["parallel_in_child"] is False
    assert got["package_tokenizer"] == "Tokenizer"  # once the package is imported, its own Tokenizer
    assert [i for row in got["package_ids"] for i in row] == want[0]


def test_concurrent_batches_share_the_stand_in(tokenizer_file):
    """Batches encoded at once on several threads each get their own ids (the stand-in stays in place
    while any of them runs, and leaves with the last)."""
    import threading

    import gigatoken

    from mftk.data import gigatoken_ids as G

    tok = gigatoken.Tokenizer.from_json(Path(tokenizer_file).read_bytes())
    want = _reference(tokenizer_file)
    batches = [TEXTS[i:] + TEXTS[:i] for i in range(len(TEXTS))] * 8
    results: list = [None] * len(batches)

    def work(k):
        flat, counts = G.encode_batch_arrays(tok.encode_batch, batches[k])
        results[k] = (flat.tolist(), counts.tolist())

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, batch in enumerate(batches):
        ids = [tok.encode(t).tolist() for t in batch]
        assert results[k] == ([i for row in ids for i in row], [len(row) for row in ids])
    assert G._state["calls"] == 0 and type(sys.modules.get("awkward")).__name__ != "_AwkwardStandIn"
    assert want[0]  # the reference tokenizer encodes these texts to something
