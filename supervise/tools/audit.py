"""Audit a code corpus before training: check every row in a process pool, keep a row only where
the validity check and (when asked) the normalizer both succeed, and write the raw and the
normalized variants with identical ids in identical order. Inputs are never modified."""
from __future__ import annotations

import ast
import json
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

from supervise.cli import Parser, UsageError, bounded_int, duration, front_door, positive_int
from supervise.contract import atomic_write_json
from supervise.vocabulary import EXIT_OK

MAX_ROW = 1 << 20  # bytes; a bigger row is a reason, not a crash
CHUNK = 256
MAX_WORKERS = max(8, 4 * (os.cpu_count() or 1))
RESULTS = {f"{v}.kept.{ext}" for v in ("raw", "normalized") for ext in ("csv", "jsonl", "parquet")} | {
    "rejected.jsonl", "audit_report.json"}  # the names of one run's result set in --out


def _alarm(signum, frame):
    raise TimeoutError()


def normalize(code: str, how: str) -> str:
    if how == "black":
        import black
        return black.format_str(code, mode=black.Mode())
    return ast.unparse(ast.parse(code)) + "\n"


def check_row(args) -> tuple:
    """(ok, reason, normalized, first error line) for one row. Module level: picklable."""
    code, how, variant, timeout = args
    if not isinstance(code, str) or not code.strip():
        return False, "empty", None, ""
    if "\x00" in code:
        return False, "nul_bytes", None, "NUL byte in the text"
    if "\ufffd" in code or any(0xD800 <= ord(c) <= 0xDFFF for c in code[:100000]):
        return False, "undecodable", None, "undecodable bytes in the text"
    if len(code.encode("utf-8", "replace")) > MAX_ROW:
        return False, "too_large", None, f"{len(code):,} characters"
    if how == "black":
        import black  # noqa: F401  imported before the row's clock starts: the import is not the row's time
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        try:
            ast.parse(code)
        except SyntaxError as e:
            return False, "syntax_error", None, f"line {e.lineno}: {e.msg}"
        except (RecursionError, MemoryError, ValueError) as e:
            return False, "parser_error", None, f"{type(e).__name__}: {str(e)[:100]}"
        if variant is not None:  # a normalized variant made elsewhere
            try:
                ast.parse(variant)
            except (SyntaxError, RecursionError, MemoryError, ValueError) as e:
                return False, "normalized_invalid", None, f"{type(e).__name__}: {str(e)[:100]}"
            if variant == code and how and normalize(code, how) != code:
                return False, "verbatim_fallback", None, f"the variant is the raw text, which {how} would change"
            return True, "", variant, ""
        if how:
            try:
                return True, "", normalize(code, how), ""
            except TimeoutError:
                raise
            except Exception as e:
                return False, "normalizer_error", None, f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
        return True, "", None, ""
    except TimeoutError:
        return False, "timeout", None, f"longer than {timeout:g}s"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _progress(done: int, total: int, t0: float, last: list) -> None:
    if total and (done * 10 // total > last[0] or done == total):
        last[0] = done * 10 // total
        print(f"audit: {done:,}/{total:,} rows ({done / total:.0%}), {done / max(time.time() - t0, 1e-9):,.0f} rows/s",
              file=sys.stderr, flush=True)


def check_all(tasks: list, workers: int) -> list:
    """check_row over every task, results in input order, in a pool of ``workers``. When a row
    kills its worker (a parser crash), the lost chunks are retried row by row, and a row that
    still breaks a process on its own is marked ``parser_error``."""
    if workers <= 1:
        return [check_row(t) for t in tasks]
    results, t0, last, done = [None] * len(tasks), time.time(), [-1], 0
    size = max(8, min(CHUNK, len(tasks) // (workers * 8) or 1))  # small enough to balance the tail
    pending = [list(range(i, min(i + size, len(tasks)))) for i in range(0, len(tasks), size)]
    while pending:
        lost = []
        with ProcessPoolExecutor(workers) as pool:
            futures = {pool.submit(_chunk, [tasks[i] for i in c]): c for c in pending}
            for fut in as_completed(futures):
                c = futures[fut]
                try:
                    for i, r in zip(c, fut.result()):
                        results[i] = r
                    done += len(c)
                    _progress(done, len(tasks), t0, last)
                except BrokenProcessPool:
                    lost.append(c)
        pending = [[i] for c in lost if len(c) > 1 for i in c]
        for c in lost:
            if len(c) == 1:
                results[c[0]] = _alone(tasks[c[0]])
                done += 1
    return results


def _chunk(tasks):
    return [check_row(t) for t in tasks]


def _alone(task):
    with ProcessPoolExecutor(1) as p:
        try:
            return p.submit(check_row, task).result()
        except BrokenProcessPool:
            return False, "parser_error", None, "the parser crashed its process"


def read_table(path: Path):
    import pandas as pd
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return pd.read_csv(path, keep_default_na=False), "csv"
        if suffix in (".jsonl", ".json"):
            return pd.read_json(path, lines=suffix == ".jsonl", dtype=False), "jsonl"
        if suffix == ".parquet":
            return pd.read_parquet(path), "parquet"
    except ImportError as e:
        raise UsageError(f"reading {path.name} needs {e.name}: pip install 'supervising-training-runs[audit]'")
    except Exception as e:
        raise UsageError(f"cannot read {path}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    raise UsageError(f"{path.name}: unknown format {suffix!r}; use .csv, .jsonl or .parquet")


def write_table(df, path: Path, fmt: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    if fmt == "csv":
        df.to_csv(tmp, index=False)
    elif fmt == "jsonl":
        df.to_json(tmp, orient="records", lines=True, force_ascii=False)
    else:
        df.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def balance(df, label: str, per_class: int, seed: int, allow_smaller: bool):
    """Sample each label group explicitly and concatenate: the label column survives (pandas'
    groupby().apply() drops it)."""
    import pandas as pd
    if label not in df.columns:
        raise UsageError(f"no column {label!r} to balance on; columns are {list(df.columns)}")
    parts = []
    for value, group in df.groupby(label, sort=True):
        if len(group) < per_class and not allow_smaller:
            raise UsageError(f"class {value!r} has {len(group)} kept rows, fewer than --per-class {per_class}; "
                             "lower it or pass --allow-smaller")
        parts.append(group.sample(n=min(per_class, len(group)), random_state=seed))
    return pd.concat(parts).sort_index()


@dataclass(frozen=True)
class AuditPlan:
    """What to audit and how (the flags of scripts/audit.py, typed)."""

    input: str                        # a CSV, JSONL or Parquet file
    out: str = "audit_out"            # the results' folder
    code_col: str = "code"
    id_col: Optional[str] = None      # None: the row position
    normalize: Optional[str] = None   # "black" | "ast" | None
    normalized: Optional[str] = None  # a normalized variant made elsewhere, matched by id
    normalized_col: Optional[str] = None
    workers: int = os.cpu_count() or 1
    row_timeout: float = 5.0          # s one row may take
    balance: Optional[str] = None     # a label column to sample per_class rows of each label from
    per_class: int = 1000
    seed: int = 0
    allow_smaller: bool = False


def audit(a: AuditPlan) -> dict:
    """Check every row, write the kept raw and normalized variants aligned row for row, the
    rejected rows with their reason and the report, swapped in at once; the report."""
    src = Path(a.input)
    df, fmt = read_table(src)
    if a.code_col not in df.columns:
        raise UsageError(f"no column {a.code_col!r} in {src.name}; columns are {list(df.columns)} (use --code-col)")
    if a.id_col and a.id_col not in df.columns:
        raise UsageError(f"no column {a.id_col!r} in {src.name}; columns are {list(df.columns)} (use --id-col)")
    ids = df[a.id_col] if a.id_col else df.index.to_series()
    if ids.duplicated().any():
        raise UsageError(f"ids are not unique in {src.name}: {ids[ids.duplicated()].iloc[0]!r} repeats")
    variants = None
    if a.normalized:
        ndf, _ = read_table(Path(a.normalized))
        col = a.normalized_col or a.code_col
        if col not in ndf.columns or (a.id_col and a.id_col not in ndf.columns):
            raise UsageError(f"{Path(a.normalized).name} needs columns {col!r}"
                             f"{' and ' + repr(a.id_col) if a.id_col else ''}; it has {list(ndf.columns)}")
        nids = ndf[a.id_col] if a.id_col else ndf.index.to_series()
        if set(nids) != set(ids):
            missing = len(set(ids) - set(nids))
            extra = len(set(nids) - set(ids))
            raise UsageError(f"the normalized variant must hold the same ids: {missing} missing, {extra} extra")
        variants = dict(zip(nids, ndf[col]))
    how = a.normalize or ("black" if a.normalized and _has_black() else "ast" if a.normalized else None)
    tasks = [(c if isinstance(c, str) else ("" if c is None else str(c)), how,
              None if variants is None else variants[i], a.row_timeout) for i, c in zip(ids, df[a.code_col])]
    t0 = time.time()
    results = check_all(tasks, a.workers)
    seconds = time.time() - t0
    kept = [ok for ok, *_ in results]
    raw_kept = df[kept]
    ext = {"csv": "csv", "jsonl": "jsonl", "parquet": "parquet"}[fmt]
    if a.balance:
        raw_kept = balance(raw_kept, a.balance, a.per_class, a.seed, a.allow_smaller)
    out = Path(a.out)
    stage = _stage(out)
    try:  # the whole result set into a staging folder, then swapped in
        write_table(raw_kept, stage / f"raw.kept.{ext}", fmt)
        if how or variants is not None:
            norm = raw_kept.copy()
            by_pos = {i: r[2] for i, r in zip(df.index, results)}
            norm[a.code_col] = [by_pos[i] for i in raw_kept.index]
            write_table(norm, stage / f"normalized.kept.{ext}", fmt)
        reasons: dict = {}
        tmp = stage / ".rejected.jsonl.tmp"
        with open(tmp, "w") as f:
            for i, (ok, reason, _, err) in zip(ids, results):
                if not ok:
                    reasons[reason] = reasons.get(reason, 0) + 1
                    f.write(json.dumps({"id": i if isinstance(i, (int, str)) else str(i), "reason": reason,
                                        "error": err}, default=str) + "\n")
        os.replace(tmp, stage / "rejected.jsonl")
        report = {"input": str(src), "rows": len(df), "kept": int(sum(kept)), "written": len(raw_kept),
                  "dropped": len(df) - int(sum(kept)), "dropped_by_reason": dict(sorted(reasons.items())),
                  "invalid_rate": (len(df) - sum(kept)) / max(len(df), 1), "normalize": how,
                  "workers": a.workers, "seconds": round(seconds, 3), "rows_per_s": round(len(df) / max(seconds, 1e-9), 1)}
        atomic_write_json(stage / "audit_report.json", report)
    except BaseException:
        import shutil
        shutil.rmtree(stage, ignore_errors=True)
        raise
    _swap_in(stage, out)
    return report


def _is_result(name: str) -> bool:
    return name in RESULTS


def _stage(out: Path) -> Path:
    """A fresh hidden folder inside ``out`` where the whole result set is written first."""
    import tempfile
    try:
        out.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".audit-", dir=out))
    except OSError as e:
        raise UsageError(f"cannot write into --out {out}: {e.strerror}; pass a writable folder")


def _swap_in(stage: Path, out: Path) -> None:
    """Replace the earlier result set in ``out`` by the staged one, never a mix of two runs: the
    earlier report goes first (a set without a report is incomplete), then every earlier result
    file, then the new files, the report last. Other files in ``out`` are left alone."""
    import shutil
    try:
        (out / "audit_report.json").unlink(missing_ok=True)
        for name in os.listdir(out):
            if _is_result(name) and (out / name).is_file():
                (out / name).unlink()
        new = sorted(os.listdir(stage), key=lambda n: n == "audit_report.json")
        for name in new:
            os.replace(stage / name, out / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _has_black() -> bool:
    import importlib.util
    return importlib.util.find_spec("black") is not None


def main(argv=None) -> int:
    p = Parser(prog="audit.py", description="Drop invalid rows of a code corpus in parallel, keeping the raw and "
               "normalized variants aligned row for row.")
    p.add_argument("input", metavar="INPUT", help="a CSV, JSONL or Parquet file")
    p.add_argument("--code-col", default="code", help="the column holding the code (default: code)")
    p.add_argument("--id-col", help="a unique id column (default: row position)")
    p.add_argument("--lang", choices=["python"], default="python", help="validity check: ast.parse (default: python)")
    p.add_argument("--normalize", choices=["black", "ast"], help="normalize each row: black's format_str or an ast round trip")
    p.add_argument("--normalized", metavar="FILE", help="a normalized variant made elsewhere, matched by id")
    p.add_argument("--normalized-col", metavar="COL", help="its code column (default: --code-col)")
    p.add_argument("--workers", type=bounded_int(1, MAX_WORKERS), default=os.cpu_count() or 1,
                   help=f"processes, at most {MAX_WORKERS} here (default: all cores)")
    p.add_argument("--row-timeout", type=duration, default=5.0, help="seconds one row may take (default: 5)")
    p.add_argument("--out", default="audit_out", help="output folder (default: audit_out)")
    p.add_argument("--balance", metavar="LABEL_COL", help="sample --per-class rows of each label")
    p.add_argument("--per-class", type=positive_int, default=1000, help="rows per class with --balance (default: 1000)")
    p.add_argument("--seed", type=bounded_int(0, 2**32 - 1), default=0, help="sampling seed, 0 to 2**32-1 (default: 0)")
    p.add_argument("--allow-smaller", action="store_true", help="keep a class with fewer rows than --per-class")
    return front_door(p, _main, argv)


def _main(a) -> int:
    if not Path(a.input).is_file():
        raise UsageError(f"{a.input} is not a file; pass a CSV, JSONL or Parquet file")
    out = Path(a.out)
    if not a.out.strip():
        raise UsageError("--out is empty; pass the folder for the results, e.g. audit_out")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; pass a folder for the results")
    for given in filter(None, (a.input, a.normalized)):
        if Path(given).resolve().parent == out.resolve() and _is_result(Path(given).name):
            raise UsageError(f"{given} is an earlier result in --out {out}, which this run replaces; "
                  "pass another --out")
    try:
        r = audit(AuditPlan(**{f.name: getattr(a, f.name) for f in fields(AuditPlan)}))
    except OSError as e:
        raise UsageError(f"cannot write the results into {a.out}: {e.strerror or e}; pass a writable folder "
              "with free space")
    by = ", ".join(f"{k} {v}" for k, v in r["dropped_by_reason"].items()) or "none"
    print(f"rows {r['rows']:,}, kept {r['kept']:,}, dropped {r['dropped']:,} ({r['invalid_rate']:.1%}): {by}")
    print(f"{r['rows_per_s']:,.0f} rows/s on {r['workers']} workers; wrote {a.out}/raw.kept.*"
          + (", normalized.kept.*" if r["normalize"] or a.normalized else "") + ", rejected.jsonl, audit_report.json")
    return EXIT_OK
