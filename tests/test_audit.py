"""audit.py on real rows: every reason, raw and normalized kept aligned, balanced sampling."""
import json

import pytest

from conftest import need, read_json, run_script

pd = need("pandas")

ROWS = [  # (id, code, reason or "" when kept)
    ("ok_func", "def add(a, b):\n    return a+b\n", ""),
    ("ok_class", "class A:\n    x = 1\n\n    def f(self):\n        return self.x\n", ""),
    ("ok_async", "async def f():\n    await g()\n", ""),
    ("py2_print", 'print "hello"\n', "syntax_error"),
    ("py2_except", "try:\n    x()\nexcept ValueError, e:\n    pass\n", "syntax_error"),
    ("truncated", "def f(a, b):\n    if a:\n        return (a +\n", "syntax_error"),
    ("javascript", "function f(x) { return x * 2; }\n", "syntax_error"),
    ("rust", "fn main() { let x: i32 = 5; println!(\"{}\", x); }\n", "syntax_error"),
    ("nul", "x = 1\x00\n", "nul_bytes"),
    ("empty", "   \n", "empty"),
    ("deep_parens", "x = " + "(" * 300 + "1" + ")" * 300 + "\n", "syntax_error"),
    ("deep_unary", "x = " + "-" * 100000 + "1\n", "parser_error"),
    ("deep_attr", "a" + ".b" * 100000 + "\n", "parser_error"),
    ("ok_unicode", "name = 'café'\n", ""),
]


def corpus(tmp_path, rows=ROWS, fmt="jsonl"):
    df = pd.DataFrame({"id": [r[0] for r in rows], "code": [r[1] for r in rows], "label": [i % 2 for i in range(len(rows))]})
    path = tmp_path / f"corpus.{fmt}"
    if fmt == "csv":
        df.to_csv(path, index=False)
    else:
        df.to_json(path, orient="records", lines=True, force_ascii=False)
    return path


def kept_ids(path):
    return pd.read_json(path, lines=True)["id"].tolist()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_every_row_gets_its_reason(workers, tmp_path):
    src = corpus(tmp_path)
    before = src.read_bytes()
    rc, out, err = run_script("audit.py", src, "--id-col", "id", "--workers", workers, "--out", tmp_path / "o", timeout=300)
    assert rc == 0, err
    rejected = {r["id"]: r["reason"] for r in map(json.loads, (tmp_path / "o" / "rejected.jsonl").read_text().splitlines())}
    assert rejected == {i: reason for i, _, reason in ROWS if reason}
    assert kept_ids(tmp_path / "o" / "raw.kept.jsonl") == [i for i, _, r in ROWS if not r]
    report = read_json(tmp_path / "o" / "audit_report.json")
    assert report["rows"] == len(ROWS) and report["kept"] == 4 and report["workers"] == int(workers)
    assert "kept 4" in out and "syntax_error 6" in out
    assert src.read_bytes() == before  # inputs are never modified


@pytest.mark.parametrize("how", ["black", "ast"])
def test_normalized_variant_is_aligned_row_for_row(how, tmp_path):
    if how == "black":
        need("black")
    rows = ROWS + [("black_breaks", "x = [1,\n  2,", "syntax_error")]
    rc, out, err = run_script("audit.py", corpus(tmp_path, rows, "csv"), "--id-col", "id", "--normalize", how,
                              "--out", tmp_path / "o", "--workers", "2", timeout=300)
    assert rc == 0, err
    raw = pd.read_csv(tmp_path / "o" / "raw.kept.csv", keep_default_na=False)
    norm = pd.read_csv(tmp_path / "o" / "normalized.kept.csv", keep_default_na=False)
    assert raw["id"].tolist() == norm["id"].tolist() == ["ok_func", "ok_class", "ok_async", "ok_unicode"]
    assert norm.set_index("id").loc["ok_func", "code"] == ("def add(a, b):\n    return a + b\n")


def test_a_row_the_normalizer_fails_on_is_dropped_from_both(tmp_path):
    deep = "x = " + "-" * 800 + "1\n"  # ast.parse takes it; the ast.unparse round trip recurses too deep
    rows = [("ok", "x = 1\n", ""), ("deep", deep, "normalizer_error"), ("ok2", "y = 2\n", "")]
    rc, out, err = run_script("audit.py", corpus(tmp_path, rows), "--id-col", "id", "--normalize", "ast",
                              "--out", tmp_path / "o", "--workers", "2", timeout=300)
    assert rc == 0, err
    rejected = [json.loads(x) for x in (tmp_path / "o" / "rejected.jsonl").read_text().splitlines()]
    assert [(r["id"], r["reason"]) for r in rejected] == [("deep", "normalizer_error")]
    assert "RecursionError" in rejected[0]["error"]
    assert kept_ids(tmp_path / "o" / "raw.kept.jsonl") == kept_ids(tmp_path / "o" / "normalized.kept.jsonl") == ["ok", "ok2"]


def test_a_row_that_hangs_the_normalizer_times_out_alone(tmp_path):
    need("black")
    huge = "".join(f"def f{i}(a,b):\n    return [a,b,{i}]\n" for i in range(4000))
    rows = [("ok", "x = 1\n", ""), ("huge", huge, "timeout"), ("ok2", "y = 2\n", "")]
    # black takes ~10 s on the huge row and ~1 ms on the others: a 1 s limit splits them on any machine
    rc, out, err = run_script("audit.py", corpus(tmp_path, rows), "--id-col", "id", "--normalize", "black",
                              "--row-timeout", "1", "--out", tmp_path / "o", "--workers", "2", timeout=300)
    assert rc == 0, err
    rejected = {r["id"]: r["reason"] for r in map(json.loads, (tmp_path / "o" / "rejected.jsonl").read_text().splitlines())}
    assert rejected == {"huge": "timeout"}
    assert kept_ids(tmp_path / "o" / "normalized.kept.jsonl") == ["ok", "ok2"]


def test_supplied_variant_with_verbatim_fallbacks(tmp_path):
    need("black")
    rows = [("a", "x=1\n", ""), ("b", "y = 2\n", ""), ("c", "def f( a ):\n  return a\n", ""), ("d", "z=[1,2]\n", "")]
    src = corpus(tmp_path, rows)
    variant = pd.DataFrame({"id": ["d", "c", "b", "a"],  # another order: matched by id
                            "code": ["z = [1, 2]\n", "def f( a ):\n  return a\n", "y = 2\n", "x = (\n"]})
    variant.to_json(tmp_path / "norm.jsonl", orient="records", lines=True)
    rc, out, err = run_script("audit.py", src, "--id-col", "id", "--normalized", tmp_path / "norm.jsonl",
                              "--normalize", "black", "--out", tmp_path / "o", timeout=300)
    assert rc == 0, err
    rejected = {r["id"]: r["reason"] for r in map(json.loads, (tmp_path / "o" / "rejected.jsonl").read_text().splitlines())}
    # c: the variant is the raw text though black would change it; b: raw is already black-clean
    assert rejected == {"a": "normalized_invalid", "c": "verbatim_fallback"}
    assert kept_ids(tmp_path / "o" / "raw.kept.jsonl") == kept_ids(tmp_path / "o" / "normalized.kept.jsonl") == ["b", "d"]
    assert pd.read_json(tmp_path / "o" / "normalized.kept.jsonl", lines=True)["code"].tolist() == ["y = 2\n", "z = [1, 2]\n"]


def test_variant_with_other_ids_is_refused(tmp_path):
    src = corpus(tmp_path)
    pd.DataFrame({"id": ["ok_func"], "code": ["x"]}).to_json(tmp_path / "n.jsonl", orient="records", lines=True)
    rc, _, err = run_script("audit.py", src, "--id-col", "id", "--normalized", tmp_path / "n.jsonl", "--out", tmp_path / "o", timeout=300)
    assert rc == 2 and "must hold the same ids: 13 missing, 0 extra" in err


def test_balance_keeps_the_label_column(tmp_path):
    rows = [(f"r{i}", f"x{i} = {i}\n", "") for i in range(40)]
    rc, out, err = run_script("audit.py", corpus(tmp_path, rows), "--id-col", "id", "--balance", "label",
                              "--per-class", "7", "--out", tmp_path / "o", "--workers", "1", timeout=300)
    assert rc == 0, err
    kept = pd.read_json(tmp_path / "o" / "raw.kept.jsonl", lines=True)
    assert "label" in kept.columns and kept["label"].value_counts().to_dict() == {0: 7, 1: 7}
    rc, _, err = run_script("audit.py", corpus(tmp_path, rows), "--balance", "label", "--per-class", "50",
                            "--out", tmp_path / "o2", timeout=300)
    assert rc == 2 and "fewer than --per-class 50" in err and "--allow-smaller" in err


@pytest.mark.parametrize("args,needle", [
    (["{src}", "--code-col", "source"], "no column 'source' in corpus.jsonl; columns are ['id', 'code', 'label']"),
    (["{dir}/absent.csv"], "is not a file"),
    (["{bad}"], "cannot read"),
    (["{dir}/x.txt"], "unknown format"),
])
def test_bad_input_is_one_line_exit_2(args, needle, tmp_path):
    src = corpus(tmp_path)
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    (tmp_path / "x.txt").write_text("code\n")
    args = [a.format(src=src, dir=tmp_path, bad=tmp_path / "bad.jsonl") for a in args]
    rc, out, err = run_script("audit.py", *args, "--out", tmp_path / "o", timeout=300)
    assert rc == 2 and needle in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
