"""The confirmatory replication's table (posgen.llm.confirm): every claim's verdict on both window sets, each
difference listed, and the check that fails on a difference a document does not list."""

from __future__ import annotations

from posgen.llm import confirm
from tests.unit.test_verdicts import deciding, summary


def test_every_claim_side_by_side_and_each_difference_listed(tmp_path, capsys):
    rows = deciding(summary(models=("old", "new"), seeds=3))
    # the fresh windows' Method A mean r leaves the band: the split's verdict differs, nothing else does
    fresh_a = rows["model"].eq("new") & rows["method"].eq("A") & rows["variant"].eq("trained")
    rows.loc[fresh_a, ["mean_rc", "mean_rc_lo", "mean_rc_hi"]] = [0.85, 0.84, 0.86]
    table = confirm.comparison(rows, {}, {}, {}, [("old", "new")])
    assert len(table) == len(confirm.model_verdicts(rows, "old", {}, {}, {}))
    differs = table[table["differs"]]
    assert list(differs["claim"]) == ["split"]
    text = confirm.confirm_markdown(table)
    assert "- attention logits ~ f(q, i - j) + g(q, k) with r = 0.959: differs (" in text
    assert confirm.unlisted(table, text) == []
    table.to_csv(tmp_path / "confirmatory.csv", index=False)
    (tmp_path / "listed.md").write_text(text)
    (tmp_path / "silent.md").write_text("Every outcome the same.\n")
    assert confirm.main(["--table", str(tmp_path / "confirmatory.csv"), "--check", str(tmp_path / "listed.md")]) == 0
    assert confirm.main(["--table", str(tmp_path / "confirmatory.csv"), "--check", str(tmp_path / "silent.md")]) == 1
    assert "does not list these differing outcomes: attention logits" in capsys.readouterr().out
    assert confirm.main(["--table", str(tmp_path / "none.csv"), "--check", str(tmp_path / "silent.md")]) == 2
