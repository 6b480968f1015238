"""PreToolUse guards: refuse the launch mistakes that waste a GPU window, before they run.

Each rule is a pure function ``(Call) -> reason | None``; a deny says the rule, the why in a
clause, and the corrected command when one can be derived. A guard decides on purpose, never
by crashing: bad input or an internal error allows the call (and says so on stderr).
``SUPERVISE_GUARD_OFF=rule,rule`` switches rules off. Standard library only: hot path.

Linear time: the command is split once by a regex lexer (``shlex`` is quadratic in the length of
a word), every rule reads the same split, and a command longer than ``MAX_COMMAND`` is decided on
its first ``MAX_COMMAND`` characters, which the reason says.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

BUNDLE = Path(__file__).resolve().parents[1]
QUIET = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
OWN_SCRIPTS = re.compile(r"(^|/)scripts/(watchdog|checkin|bench|audit|smoke|plot|demo|launch|stop)\.py$")
PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)?)?$")
LAUNCHERS = {"torchrun", "deepspeed"}
SCHEDULERS = {"sbatch"}  # a batch job detaches by design: a launch that needs no run_in_background
LOG_FILE = re.compile(r"(\.log|\.out|\.err|\.txt)$|(^|/)nohup\.out$")
BIG = 256 << 10
MAX_TAIL = 200
CREDENTIALS = ("~/.git-credentials", "~/.netrc", "~/.aws/credentials", "~/.config/gh/hosts.yml",
               "~/.cache/huggingface/token", "~/.huggingface/token", "~/.ssh/id_", "~/.docker/config.json",
               "~/.kaggle/kaggle.json", "~/.config/huggingface/token")
SECRET_VAR = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD", re.I)
OPERATORS = {"&&", "||", ";", "|", "&", "|&", ";;", "(", ")"}
ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
MAX_COMMAND = 256 << 10  # characters of a command the guard reads; past it, it decides on those
MAX_FIX = 8000  # a corrected command longer than this is not shown (hook output is capped at 10,000)


@dataclass
class Call:
    """One tool call as the hook sees it."""

    tool: str
    command: str = ""
    background: bool = False
    cwd: str = "."
    env: dict = field(default_factory=dict)
    content: str = ""
    path: str = ""
    read: int = 0  # the command's full length when only its first MAX_COMMAND characters were read
    memo: dict = field(default_factory=dict, repr=False, compare=False)  # the split, read once per call


# A run of ;&|() is one operator token, except the & of a redirection (2>&1, >&2, &>log), which
# stays in its word: ``python train.py > log 2>&1`` runs in the foreground.
_RAW_TOKEN = re.compile(r"""(?:[;|()]|&(?!>))+|(?:[^ \t\r\n;&|()<>'"\\]+|[<>]+&?|&>+|'[^']*'|"[^"\\]*(?:\\.[^"\\]*)*"|\\.)+|['"\\]""", re.S)
_QUOTED_PART = re.compile(r"""'([^']*)'|"([^"\\]*(?:\\.[^"\\]*)*)"|\\(.)|([^'"\\]+)""", re.S)
_DOUBLE_ESCAPE = re.compile(r'\\([\\"])')


def _unquote(word: str) -> str:
    return "".join(m[1] if m[1] is not None else _DOUBLE_ESCAPE.sub(r"\1", m[2]) if m[2] is not None else
                   m[3] if m[3] is not None else m[4] for m in _QUOTED_PART.finditer(word))


def tokens(command: str) -> list[str]:
    """Words and operators as ``shlex.shlex(command, posix=True, punctuation_chars=";&|()")`` with
    ``whitespace_split`` splits them (quotes removed, a quoted part kept in its word; a run of
    ``;&|()`` is one token; unlike shlex, a redirection's ``&`` stays in its word: ``2>&1``), in
    linear time: one regex pass, quotes undone only in the words that hold one. ValueError on an
    unclosed quote or a final backslash."""
    out = _RAW_TOKEN.findall(command)
    for i, t in enumerate(out):
        if "'" in t or '"' in t or "\\" in t:
            if t in ("'", '"', "\\"):  # the lone character no other branch could take
                raise ValueError("No escaped character" if t == "\\" else "No closing quotation")
            out[i] = _unquote(t)
    return out


def simple_commands(command: str) -> list[tuple[list[str], str]]:
    """[(words, operator that follows)] for each simple command of a chain or pipeline."""
    out, cur = [], []
    for t in tokens(command):
        if t in OPERATORS:
            out.append((cur, t))
            cur = []
        else:
            cur.append(t)
    out.append((cur, ""))
    return [(w, op) for w, op in out if w]


def _parts(call: Call) -> Optional[list]:
    """simple_commands of the call's command, split once per call; None when it does not split."""
    if "parts" not in call.memo:
        try:
            call.memo["parts"] = simple_commands(call.command)
        except ValueError:
            call.memo["parts"] = None
    return call.memo["parts"]


def _split_env(words: list[str]) -> tuple[dict, list[str]]:
    """Leading VAR=value assignments (also after ``env``) and the rest."""
    env, i = {}, 0
    while i < len(words):
        w = words[i]
        if ENV_ASSIGN.match(w):
            k, _, v = w.partition("=")
            env[k] = v
        elif w == "env" and i + 1 < len(words):
            pass
        else:
            break
        i += 1
    return env, words[i:]


def _launch(words: list[str]) -> Optional[dict]:
    """A Python launch in this simple command: {'env', 'argv', 'kind', 'at'} or None."""
    env, rest = _split_env(words)
    for wrapper in ("nohup", "setsid", "exec", "time", "nice"):
        if rest and rest[0] == wrapper:
            rest = rest[1:]
    if not rest:
        return None
    exe, name = rest[0], os.path.basename(rest[0])
    if PYTHON.match(exe):
        kind = "python"
    elif name in LAUNCHERS:  # torchrun, deepspeed, also as .venv/bin/torchrun: a Python launch
        kind = name
    elif name == "accelerate" and rest[1:2] == ["launch"]:
        kind = "accelerate"
    elif name == "uv" and rest[1:2] == ["run"]:
        kind = "uv"
    else:
        return None
    script = next((w for w in rest[1:] if w.endswith(".py")), "")
    return {"env": env, "argv": rest, "kind": kind, "script": script}


def _own(launch: dict) -> bool:
    s = launch["script"]
    if not s or OWN_SCRIPTS.search(s):
        return bool(s)
    if s not in _OWN:
        try:
            _OWN[s] = Path(s).resolve().is_relative_to(BUNDLE / "scripts")
        except (OSError, ValueError, RuntimeError):  # a path too long or looping: not ours
            _OWN[s] = False
    return _OWN[s]


_OWN: dict = {}  # script path -> is it one of the bundle's scripts (one process decides one call)


def _exported(call: Call) -> dict:
    if "exported" not in call.memo:
        env = {}
        for words, _ in _parts(call) or []:
            if words[0] == "export":
                for w in words[1:]:
                    if ENV_ASSIGN.match(w):
                        k, _, v = w.partition("=")
                        env[k] = v
        call.memo["exported"] = env
    return call.memo["exported"]


def _launches(call: Call) -> list[dict]:
    if "launches" not in call.memo:
        call.memo["launches"] = [x for x in (_launch(w) for w, _ in _parts(call) or []) if x]
    return call.memo["launches"]


def _missing(call: Call, launch: dict) -> list[str]:
    exported = _exported(call)
    return [k for k, v in QUIET.items() if launch["env"].get(k, exported.get(k, call.env.get(k))) != v]


def _buffered(call: Call, launch: dict) -> bool:
    have = {**call.env, **_exported(call), **launch["env"]}
    if have.get("PYTHONUNBUFFERED", "") not in ("", "0"):
        return False
    return not (launch["kind"] == "python" and any(a == "-u" or (a.startswith("-") and not a.startswith("--")
                                                                and "u" in a[1:] and len(a) < 6)
                                                    for a in launch["argv"][1:3]))


def one_line(command: str) -> Optional[str]:
    """The command joined onto one physical line, or None when it cannot be done safely."""
    pieces = command.strip().split("\\\n")  # backslash-newline continuations become one space
    text = " ".join((p if i == 0 else p.lstrip()).rstrip(" \t") if i < len(pieces) - 1 else
                    (p if i == 0 else p.lstrip()) for i, p in enumerate(pieces))
    if "<<" in text:
        return None
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    try:
        for ln in lines:
            tokens(ln)
    except ValueError:  # a quote spans lines: a multi-line -c string
        return None
    out = lines[:1]
    for prev, ln in zip(lines, lines[1:]):
        out.append((" " if prev.endswith(("|", ";", "&")) else " && ") + ln)
    return "".join(out)


def fix_env(call: Call, command: str) -> str:
    """Add -u and the missing quiet variables to each training launch in ``command``, each
    launch's own word in turn (searching on from the last one, so two launches of ``python``
    are each fixed once and the bundle's own scripts are passed over)."""
    sub = Call(call.tool, command, call.background, call.cwd, call.env)
    out, pos = [], 0  # the pieces of the new command; pos: how far ``command`` is copied
    for launch in _launches(sub):
        head = shlex.quote(launch["argv"][0])
        m = re.compile(r"(?<![\w/.=-])" + re.escape(head) + r"(?![\w.])").search(command, pos)
        if m is None:
            continue
        if _own(launch):
            out.append(command[pos:m.end()])
            pos = m.end()
            continue
        buffered = _buffered(sub, launch)
        prefix = " ".join(f"{k}={v}" for k, v in {**({"PYTHONUNBUFFERED": "1"} if buffered else {}),
                                                     **{k: QUIET[k] for k in _missing(sub, launch)}}.items())
        new_head = head + (" -u" if launch["kind"] == "python" and buffered else "")
        out += [command[pos:m.start()], f"{prefix} {new_head}" if prefix else new_head]
        pos = m.end()
    out.append(command[pos:])
    return "".join(out)


def corrected(call: Call) -> Optional[str]:
    """The command fixed (one line, -u, the quiet variables); None when it cannot be derived, or
    when only the command's head was read (a fix of a cut command would run half of it)."""
    if call.read:
        return None
    cmd = one_line(call.command) if "\n" in call.command.strip() else call.command.strip()
    return fix_env(call, cmd) if cmd else None


def _deny(rule: str, why: str, fix: Optional[str]) -> str:
    reason = f"[{rule}] {why}"
    if fix and len(fix) > MAX_FIX:
        return reason + f" (The corrected command is {len(fix):,} characters, too long to show: put the steps in a " \
                        "script file and launch that.)"
    return reason + (f" Run instead: {fix}" if fix else "")


# ----------------------------------------------------------------------------- the rules
def rule_one_line(call: Call) -> Optional[str]:
    if call.tool != "Bash" or not call.background or "\n" not in call.command.strip():
        return None
    fix = corrected(call)
    return _deny("one_line", "A background command must be ONE physical line: its newlines can collapse into "
                 "spaces and run as one broken command while the GPU sits at 0%." +
                 ("" if fix else " Put the steps in a script file and launch that."), fix)


def rule_unbuffered(call: Call) -> Optional[str]:
    if call.tool != "Bash" or not call.background or "\n" in call.command.strip():
        return None
    if any(not _own(x) and _buffered(call, x) for x in _launches(call)):
        return _deny("unbuffered", "A background Python launch needs -u or PYTHONUNBUFFERED=1, or its log "
                     "stays empty for minutes and hides progress and errors.", corrected(call))
    return None


def rule_quiet_env(call: Call) -> Optional[str]:
    if call.tool != "Bash" or not call.background or "\n" in call.command.strip():
        return None
    missing = list(dict.fromkeys(k for x in _launches(call) if not _own(x) for k in _missing(call, x)))
    if missing:
        return _deny("quiet_env", f"Set {', '.join(missing)}: progress bars fill the log with thousands of "
                     "lines that bury the real error.", corrected(call))
    return None


DETACH = re.compile(r"(^|[\s;&|(])(nohup|setsid|disown)(\s|$)|screen\s+-d?m")
TMUX_NEW = re.compile(r"tmux\s+new(-session)?\b")
DASH_D = re.compile(r"\s-d")


def detached(text: str) -> bool:
    """nohup, setsid, disown, ``screen -dm``, or ``tmux new`` with ``-d`` later on the same line; in
    linear time (one search for the first ``tmux new`` of each line, one for a ``-d`` after it)."""
    if DETACH.search(text):
        return True
    for line in text.split("\n"):
        m = TMUX_NEW.search(line)
        if m and DASH_D.search(line, m.end()):
            return True
    return False


def rule_notified(call: Call) -> Optional[str]:
    if call.tool != "Bash":
        return None
    parts = _parts(call)
    if parts is None:
        return None
    if any(os.path.basename(_split_env(w)[1][0]) in SCHEDULERS for w, _ in parts if _split_env(w)[1]):
        return None  # sbatch: the scheduler runs the job detached by design; the watchdog follows it
    text = call.command
    trains = bool(_launches(call)) or bool(re.search(r"python\d*(\.\d+)?\s|torchrun|accelerate\s+launch|deepspeed", text))
    # in the foreground any & detaches; in a background job only a trailing one does (a & b & wait
    # keeps the job, and its notification, until both end)
    amp = parts[-1][1] == "&" if call.background else any(op == "&" for _, op in parts)
    if not (trains and (amp or detached(text))):
        return None
    fix = detach_fix(text) if "\n" not in text.strip() and not call.read else None
    where = " (RUN_DIR: the run's folder, for train.log and metrics.jsonl.)" if fix and " RUN_DIR -- " in fix else ""
    return _deny("notified", "A detached launch (&, nohup, setsid, disown, tmux -d, screen -dm) leaves no launch "
                 "record and never wakes you: start the trainer with the launcher (it detaches it to outlive this "
                 "session, and records it), then run the watchdog line it prints with run_in_background: true."
                 + where, fix)


# ----------------------------------------------------------------------------- the launcher's line as the fix
WRAPPERS = {"nohup", "setsid"}         # dropped: the launcher detaches the command itself
MULTIPLEXERS = {"tmux", "screen"}      # the training command is found inside their arguments
OUT_FLAGS = ("--out", "--output_dir", "--output-dir", "--out-dir", "--out_dir", "--run-dir", "--run_dir")
LAUNCHER_ENV = {"PYTHONUNBUFFERED", *QUIET}  # the launcher sets these itself
REDIRECT = re.compile(r"^(?:\d*|&)(?:>>?|<)&?(.*)$")


def _raw_parts(command: str) -> list[tuple[list[tuple[str, str]], str]]:
    """simple_commands with each word's raw text (its quoting kept) beside its value:
    [([(raw, word), ...], operator that follows)]. ValueError as ``tokens``."""
    out, cur = [], []
    for raw in _RAW_TOKEN.findall(command):
        if raw in ("'", '"', "\\"):
            raise ValueError("unbalanced quoting")
        if raw in OPERATORS:
            out.append((cur, raw))
            cur = []
        else:
            cur.append((raw, _unquote(raw) if "'" in raw or '"' in raw or "\\" in raw else raw))
    out.append((cur, ""))
    return [(w, op) for w, op in out if w]


def _launch_at(pairs: list) -> Optional[tuple[list[str], list]]:
    """(the raw VAR=value words to keep, the (raw, word) pairs of the training command with its
    wrappers and redirections dropped) when this simple command is a detached training launch
    (also among a tmux or screen command's words); None when it is none, or one of the bundle's
    own scripts (kept as it is)."""
    i, env = 0, []
    while i < len(pairs) and (ENV_ASSIGN.match(pairs[i][1]) or pairs[i][1] == "env"):
        if pairs[i][1] != "env" and pairs[i][1].partition("=")[0] not in LAUNCHER_ENV:
            env.append(pairs[i][0])
        i += 1
    while i < len(pairs) and os.path.basename(pairs[i][1]) in WRAPPERS:
        i += 1
        while i < len(pairs) and pairs[i][1].startswith("-"):
            i += 1
    rest = pairs[i:]
    if rest and os.path.basename(rest[0][1]) in MULTIPLEXERS:  # tmux new -d -s t python train.py
        k = next((k for k in range(1, len(rest)) if not rest[k][1].startswith("-")
                  and _launch([w for _, w in rest[k:]])), None)
        return _launch_at(rest[k:]) if k else None
    found = _launch([w for _, w in rest])
    if not found or _own(found):
        return None
    cmd, skip = [], False
    for raw, word in rest:
        if skip:
            skip = False
            continue
        m = REDIRECT.match(raw)
        if m:  # the launcher owns the output: it appends to RUN_DIR/train.log
            skip = m.group(1) == ""
            continue
        cmd.append((raw, word))
    return env, cmd


def _run_dir_of(pairs: list, command: str) -> str:
    """The run folder a training command names: --out and its spellings, else the folder of the
    train.log its output went to; else the placeholder RUN_DIR."""
    words = [w for _, w in pairs]
    for i, w in enumerate(words):
        flag, eq, value = w.partition("=")
        if flag in OUT_FLAGS and (eq or i + 1 < len(words)):
            # the word as it was written, so that its $VAR (and, as a word of its own, its ~) expands as
            # it did; quoted again, it would not (a ~ after --out= is not expanded: quoted, as it was)
            raw = pairs[i][0].partition("=")[2] if eq and pairs[i][0].startswith(flag + "=") else \
                None if eq else pairs[i + 1][0]
            ok = raw and not REDIRECT.match(raw) and not (eq and raw.startswith("~"))
            return raw if ok else shlex.quote(value if eq else words[i + 1])
    for m in re.finditer(r"(?:^|\s)\d*>>?\s*(\S*train\.log)(?=\s|$)", command):
        target = os.path.dirname(_unquote(m.group(1)))
        if target:
            return shlex.quote(target)
    return "RUN_DIR"


def _trains(command: str) -> bool:
    try:
        return any(_launch_at(pairs) for pairs, _ in _raw_parts(command))
    except ValueError:
        return False


def detach_fix(command: str) -> Optional[str]:
    """``command`` with each detached training launch started by the launcher instead (its
    nohup, setsid, tmux or screen, its output redirection and its ``&`` dropped; VAR=value words
    other than the ones the launcher sets kept in front), ``disown`` and a trailing ``&`` dropped,
    the other steps kept. None when it cannot be derived."""
    from .launch import launcher_line  # the deny path only: the hook's hot path stays small
    try:
        parts = _raw_parts(command)
    except ValueError:
        return None
    out: list = []  # [text, operator]
    piped = False   # the pipe after a launch (| tee log) is output capture: the launcher does it
    for pairs, op in parts:
        if piped:
            out[-1][1], piped = op, op in ("|", "|&")
            continue
        words = _split_env([w for _, w in pairs])[1]
        head = os.path.basename(words[0]) if words else ""
        if head == "disown":
            continue
        found = _launch_at(pairs)
        inner = next((w for _, w in pairs[1:] if " " in w and _trains(w)), None) if head in MULTIPLEXERS else None
        if found is None and inner is not None:
            text = detach_fix(inner)  # tmux new -d 'cd /w && python train.py > log 2>&1': its own chain
            if text is None:
                return None
            out.append([text, op])
            continue
        if found is None:
            out.append([" ".join(r for r, w in pairs if w not in WRAPPERS), op])
            continue
        env, cmd = found
        if not cmd:
            return None
        line = launcher_line(_run_dir_of(cmd, " ".join(r for r, _ in pairs)), " ".join(r for r, _ in cmd))
        out.append([" ".join([*env, line]), op])
        piped = op in ("|", "|&")
    if not out:
        return None
    text = ""
    for i, (part, op) in enumerate(out):
        last = i == len(out) - 1
        op = "&&" if op == "&" else op
        text += part + ("" if last or not op else ("; " if op == ";" else f" {op} "))
    return None if detached(text) else text


def _size(call: Call, path: str) -> int:
    p = Path(os.path.expanduser(path))
    p = p if p.is_absolute() else Path(call.cwd) / p
    try:
        return p.stat().st_size
    except OSError:
        return -1


def _tail_n(args: list[str]) -> Optional[int]:
    for i, a in enumerate(args):
        m = re.match(r"^(?:-n|--lines=?)(\+?\d+)$", a) or re.match(r"^-(\d+)$", a)
        if m:
            return int(m.group(1).lstrip("+"))
        if a in ("-n", "--lines") and i + 1 < len(args) and args[i + 1].lstrip("+").isdigit():
            return int(args[i + 1].lstrip("+"))
    return None


def rule_no_log_dumps(call: Call) -> Optional[str]:
    if call.tool != "Bash":
        return None
    for words, op in _parts(call) or []:
        if op in ("|", "|&"):
            continue  # its output is filtered further down the pipe
        _, words = _split_env(words)
        if not words:
            continue
        exe = os.path.basename(words[0])
        if exe not in ("cat", "less", "more", "bat", "head", "tail"):
            continue
        args = words[1:]
        files = [a for a in args if not a.startswith("-") and not a.lstrip("+").isdigit()]
        if exe in ("cat", "less", "more", "bat"):
            big = [f for f in files if _size(call, f) > BIG]
            if big:
                return _deny("no_log_dumps", f"{big[0]} is {_size(call, big[0]) // 1024} KiB: dumping it floods "
                             "the context.", "python " + str(BUNDLE / "scripts" / "checkin.py") +
                             f" {shlex.quote(os.path.dirname(big[0]) or '.')} (or tail -n 20 metrics.jsonl, or "
                             f"grep -avE \"it/s|Materializing|Loading weights\" {shlex.quote(big[0])} | tail -n 50)")
        if exe in ("head", "tail") and "-f" not in args:
            n = _tail_n(args)
            logs = [f for f in files if LOG_FILE.search(f)]
            if n is not None and n > MAX_TAIL and logs:
                return _deny("no_log_dumps", f"{n} lines of {logs[0]} flood the context; read the tail through "
                             "the progress-bar filter.", f"grep -avE \"it/s|Materializing|Loading weights\" "
                             f"{shlex.quote(logs[0])} | tail -n 50")
    return None


def rule_no_credential_hunting(call: Call) -> Optional[str]:
    if call.tool != "Bash":
        return None
    text = call.command
    home = os.path.expanduser("~")
    for cred in CREDENTIALS:
        tail = cred[2:]
        for form in (cred, "$HOME/" + tail, "${HOME}/" + tail, home + "/" + tail):
            if form in text:
                return _deny("no_credential_hunting", f"{cred} holds someone's credentials: do not read them; if a "
                             "push or download fails with 401, tell the user the token is missing or revoked.", None)
    if re.search(r"\bgit\s+credential(-\w+)?\s+(fill|get)\b", text):
        return _deny("no_credential_hunting", "git credential fill prints stored secrets: tell the user instead.", None)
    parts = _parts(call) or []
    for i, (words, op) in enumerate(parts):
        _, words = _split_env(words)
        if not words:
            continue
        exe = os.path.basename(words[0])
        shown = []
        if exe in ("echo", "printf"):
            shown = [v for w in words[1:] for v in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", w)]
        elif exe == "printenv":
            shown = words[1:] or (["*"] if op in ("|", "|&") and i + 1 < len(parts)
                                  and SECRET_VAR.search(" ".join(parts[i + 1][0])) else [])
        elif exe in ("env", "set", "export") and len(words) == 1 and op in ("|", "|&") and i + 1 < len(parts):
            shown = ["*"] if SECRET_VAR.search(" ".join(parts[i + 1][0])) else []
        secret = [v for v in shown if v == "*" or SECRET_VAR.search(v)]
        if secret:
            return _deny("no_credential_hunting", "Printing secret variables puts them in the transcript: tell "
                         "the user what is missing instead.", None)
    return None


V4_ARGS = re.compile(r"\b(evaluation_strategy|overwrite_output_dir)\s*=")


def transformers_major() -> Optional[int]:
    from importlib import metadata
    try:
        return int(metadata.version("transformers").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return None


def rule_v5_arguments(call: Call) -> Optional[str]:
    if call.tool not in ("Write", "Edit", "MultiEdit") or not call.path.endswith(".py"):
        return None
    found = sorted(set(V4_ARGS.findall(call.content)))
    if not found or (transformers_major() or 0) < 5:
        return None
    return _deny("v5_arguments", f"{', '.join(found)} were removed in transformers v5 (installed here): "
                 "TrainingArguments raises TypeError.", "write eval_strategy= instead of evaluation_strategy=, "
                 "and drop overwrite_output_dir=")


# notified before the environment rules: a detached launch's fix is the launcher line, which
# sets the environment itself
RULES: dict[str, Callable[[Call], Optional[str]]] = {
    "one_line": rule_one_line, "notified": rule_notified, "unbuffered": rule_unbuffered,
    "quiet_env": rule_quiet_env, "no_log_dumps": rule_no_log_dumps,
    "no_credential_hunting": rule_no_credential_hunting, "v5_arguments": rule_v5_arguments,
}


def truncate(call: Call) -> Call:
    """The call itself, or, for a command longer than MAX_COMMAND, a copy that holds its first
    MAX_COMMAND characters (cut at the last line break, else the last blank) with ``read`` set."""
    if len(call.command) <= MAX_COMMAND:
        return call
    head = call.command[:MAX_COMMAND]
    cut = max(head.rfind("\n"), head.rfind(" "))
    head = head[:cut] if cut > MAX_COMMAND // 2 else head
    return Call(call.tool, head, call.background, call.cwd, call.env, call.content, call.path, read=len(call.command))


def decide(call: Call) -> Optional[str]:
    """The first rule that denies, as its reason; None allows. A command past MAX_COMMAND is
    decided on its first MAX_COMMAND characters: a deny then says so and offers no corrected
    command (it would be cut too)."""
    off = {r.strip() for r in call.env.get("SUPERVISE_GUARD_OFF", "").split(",")}
    call = truncate(call)
    for name, rule in RULES.items():
        if name not in off:
            reason = rule(call)
            if reason:
                if call.read:
                    reason += (f" (Decided on the first {MAX_COMMAND >> 10} KiB of this {call.read / 1024:,.0f} KiB "
                               "command: put the steps in a script file.)")
                return reason
    return None


def call_from_hook(data: dict, env: dict) -> Call:
    ti = data.get("tool_input") or {}
    tool = data.get("tool_name", "")
    content = ti.get("content") or ti.get("new_string") or ""
    if tool == "MultiEdit":
        content = "\n".join(e.get("new_string", "") for e in ti.get("edits") or [])
    return Call(tool=tool, command=ti.get("command") or "", background=bool(ti.get("run_in_background")),
                cwd=data.get("cwd") or os.getcwd(), env=dict(env), content=content, path=ti.get("file_path") or "")


def main(stdin=None, stdout=None, env=None) -> int:
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    try:
        data = json.loads(stdin.read() or "{}")
        call = call_from_hook(data, os.environ if env is None else env)
        reason = decide(call)
        if reason is None and len(call.command) > MAX_COMMAND:
            print(f"supervise guard: allowed after reading the first {MAX_COMMAND >> 10} KiB of a "
                  f"{len(call.command) / 1024:,.0f} KiB command", file=sys.stderr)
    except Exception as e:  # decide on purpose, never by crashing: allow, and say so
        print(f"supervise guard: allowed without a check ({type(e).__name__}: {str(e)[:120]})", file=sys.stderr)
        return 0
    if reason:
        json.dump({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                          "permissionDecisionReason": reason[:9000]}}, stdout)
    return 0
