"""torchrun, two ranks (gloo, CPU), DDP, a NaN planted on rank 1 only: the
merged view names rank 1 and that step, and shows that rank 0 received the
NaN through the all-reduce; with step skipping, both ranks skip the same
step and end with identical, finite parameters."""
import sqlite3

import torch

from conftest import NANHUNT, PYTHON, SCRIPTS, clean_env, nanhunt_run, run, view_json

SCRIPT = SCRIPTS / "ddp_nan_on_rank1.py"


def torchrun(out, saved, **settings):
    saved.mkdir()
    return nanhunt_run([PYTHON, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=2", SCRIPT, saved], out,
                       env=clean_env(**settings), timeout=600)


def failure(r):
    """What torchrun said of a failed rank (its report precedes nanhunt's
    summary, which fills the end of stderr), then the end of both streams."""
    cut = r.stderr.find("FIRST NON-FINITE VALUES")
    return (r.stdout[-2000:] + "\n--- stderr before nanhunt's summary ---\n" +
            r.stderr[:cut if cut >= 0 else len(r.stderr)][-6000:] +
            "\n--- end of stderr ---\n" + r.stderr[-1500:])


def test_the_merged_view_names_the_rank_where_it_began(out, tmp_path):
    r = torchrun(out, tmp_path / "saved")
    assert r.returncode == 0, failure(r)
    report = view_json(out)
    first = report["first_origin"]
    assert (first["rank"], first["step"], first["kind"], first["phase"]) == \
        ("1", 3, "input", "forward"), first
    ranks = {x["rank"]: x for x in report["ranks"]}
    assert ranks["0"]["kind"] == "received" and ranks["0"]["step"] == 3, ranks
    text = run([NANHUNT, "view", out]).stdout
    assert "rank 1: input" in text and "<- began here" in text
    assert "rank 0: received them from another rank" in text


def test_with_skipping_both_ranks_skip_alike_and_stay_equal(out, tmp_path):
    saved = tmp_path / "saved"
    r = torchrun(out, saved, NANHUNT_SKIP_NONFINITE_STEPS="1")
    assert r.returncode == 0, failure(r)
    skipped = {}
    for trace in out.glob("*.sqlite"):
        db = sqlite3.connect(trace)
        rank = db.execute("SELECT value FROM meta WHERE key = 'rank'").fetchone()
        if rank is not None:
            skipped[rank[0]] = [s for (s,) in db.execute("SELECT step FROM skipped_steps")]
    assert skipped == {"0": [3], "1": [3]}, skipped
    p0, p1 = torch.load(saved / "params-0.pt"), torch.load(saved / "params-1.pt")
    for name in p0:
        assert torch.isfinite(p0[name]).all(), name
        assert p0[name].numpy().tobytes() == p1[name].numpy().tobytes(), name
