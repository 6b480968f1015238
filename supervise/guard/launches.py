"""Launch shapes: a training launch on one physical line, unbuffered, with the quiet variables,
and detached so that the agent is woken when it ends (``run_in_background`` or the launcher);
each deny carries the corrected command, the launcher's own line for a detached launch.
Standard library only: hot path (the launcher's line is imported on the deny path only)."""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Callable, Optional

from supervise.guard.shell import (
    Call, ENV_ASSIGN, MAX_NEST, REDIRECT, c_string, command_items, command_parts, deny, has_nesting,
    raw_items, shell_c, split_env, tokens, unbrace, unquote)
from supervise.vocabulary import BUNDLE, PYTHON, QUIET

OWN_SCRIPTS = re.compile(r"(^|/)scripts/(watchdog|checkin|bench|audit|smoke|plot|demo|launch|stop)\.py$")
LAUNCHERS = {"torchrun", "deepspeed"}
SCHEDULERS = {"sbatch"}  # a batch job detaches by design: a launch that needs no run_in_background


def _launch(words: list[str]) -> Optional[dict]:
    """A Python launch in this simple command: {'env', 'argv', 'kind', 'at'} or None."""
    env, rest = split_env(words)
    for wrapper in ("coproc", "nohup", "setsid", "exec", "time", "nice"):
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
        for words, _ in command_parts(call) or []:
            if words[0] == "export":
                for w in words[1:]:
                    if ENV_ASSIGN.match(w):
                        k, _, v = w.partition("=")
                        env[k] = v
        call.memo["exported"] = env
    return call.memo["exported"]


def _launches(call: Call) -> list[dict]:
    if "launches" not in call.memo:
        call.memo["launches"] = [x for x in (_launch(w) for w, _ in command_parts(call) or []) if x]
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


# ----------------------------------------------------------------------------- the rules
def rule_one_line(call: Call) -> Optional[str]:
    if call.tool != "Bash" or not call.background or "\n" not in call.command.strip():
        return None
    fix = corrected(call)
    return deny("one_line", "A background command must be ONE physical line: its newlines can collapse into "
                 "spaces and run as one broken command while the GPU sits at 0%." +
                 ("" if fix else " Put the steps in a script file and launch that."), fix)


def rule_unbuffered(call: Call) -> Optional[str]:
    if call.tool != "Bash" or not call.background or "\n" in call.command.strip():
        return None
    if any(not _own(x) and _buffered(call, x) for x in _launches(call)):
        return deny("unbuffered", "A background Python launch needs -u or PYTHONUNBUFFERED=1, or its log "
                     "stays empty for minutes and hides progress and errors.", corrected(call))
    return None


def rule_quiet_env(call: Call) -> Optional[str]:
    if call.tool != "Bash" or not call.background or "\n" in call.command.strip():
        return None
    missing = list(dict.fromkeys(k for x in _launches(call) if not _own(x) for k in _missing(call, x)))
    if missing:
        return deny("quiet_env", f"Set {', '.join(missing)}: progress bars fill the log with thousands of "
                     "lines that bury the real error.", corrected(call))
    return None


DETACH = re.compile(r"(^|[\s;&|(])(nohup|setsid|disown|coproc)(\s|$)|screen\s+-d?m")
TMUX_NEW = re.compile(r"tmux\s+new(-session)?\b")
DASH_D = re.compile(r"\s-d")
SYSTEMD_RUN = re.compile(r"(?:^|[\s;&|(/])systemd-run(?=\s)")
# systemd-run's options that take the next word as their value (--unit NAME, -p KEY=VALUE, ...)
SYSTEMD_VALUE_OPTS = {"-p", "--property", "-u", "--unit", "-E", "--setenv", "-M", "--machine", "-H", "--host",
                      "--uid", "--gid", "--nice", "--working-directory", "--description", "--slice", "--service-type",
                      "--on-active", "--on-boot", "--on-startup", "--on-unit-active", "--on-unit-inactive",
                      "--on-calendar", "--timer-property", "--path-property", "--socket-property"}
SYSTEMD_OPTS_READ = 64  # options of one systemd-run read before its command (a bound: linear time)
_SHELL_WORD = re.compile(r"\s*([^\s;&|()]+)")


def _systemd_detaches(text: str, pos: int) -> bool:
    """Does the systemd-run that ends at ``pos`` start its command as a transient service (it runs on
    after the call, outside it) rather than in the caller's own process (``--scope``)?"""
    skip = False
    for _ in range(SYSTEMD_OPTS_READ):
        m = _SHELL_WORD.match(text, pos)
        if m is None:
            return False  # no command: nothing is started
        w, pos = m.group(1).strip("'\""), m.end()
        if skip:
            skip = False
        elif w == "--scope":
            return False
        elif w == "--" or not w.startswith("-"):
            return True
        else:
            skip = w in SYSTEMD_VALUE_OPTS
    return True


def detached(text: str) -> bool:
    """nohup, setsid, disown, coproc, ``screen -dm``, ``systemd-run`` (a transient service; not with
    ``--scope``), or ``tmux new`` with ``-d`` later on the same line; in linear time (one search for
    the first ``tmux new`` of each line, one for a ``-d`` after it; at most SYSTEMD_OPTS_READ words
    after each systemd-run)."""
    if DETACH.search(text):
        return True
    if "systemd-run" in text and any(_systemd_detaches(text, m.end()) for m in SYSTEMD_RUN.finditer(text)):
        return True
    for line in text.split("\n"):
        m = TMUX_NEW.search(line)
        if m and DASH_D.search(line, m.end()):
            return True
    return False


def rule_notified(call: Call) -> Optional[str]:
    if call.tool != "Bash":
        return None
    parts = command_parts(call)
    if parts is None:
        return None
    if any(os.path.basename(split_env(w)[1][0]) in SCHEDULERS for w, _ in parts if split_env(w)[1]):
        return None  # sbatch: the scheduler runs the job detached by design; the watchdog follows it
    text, items = call.command, command_items(call)
    # in the foreground any & detaches; in a background job only a trailing one does (a & b & wait
    # keeps the job, and its notification, until both end); items, not parts: the & of ``(...) &``
    # follows no command
    amp = bool(items) and items[-1][1] == "&" if call.background else any(op == "&" for _, op in items)
    # a launch inside a -c string that TRAINING_TEXT misses is a uv run: the walk looks for one then
    trains = bool(_launches(call)) or bool(TRAINING_TEXT.search(text)) or ("uv" in text and _items_train(items, 0))
    if not ((trains and (amp or detached(text))) or (has_nesting(text) and _nested_detach(items, 0))):
        return None
    fix = detach_fix(text, 0, items) if "\n" not in text.strip() and not call.read else None
    where = " (RUN_DIR: the run's folder, for train.log and metrics.jsonl.)" if fix and " RUN_DIR -- " in fix else ""
    how = "" if fix else f" Launch it as {_launcher_form()}."
    return deny("notified", "A detached launch (&, nohup, setsid, disown, coproc, systemd-run, tmux -d, screen -dm, "
                 "in bash -c, eval or ( ) too) leaves no launch record and never wakes you: start the trainer with "
                 "the launcher (it detaches and records it), then run the watchdog line it prints with "
                 "run_in_background: true." + where + how, fix)


def _launcher_form() -> str:
    from supervise.act.launch import launcher_line  # the deny path only: the hook's hot path stays small
    return launcher_line("RUN_DIR", "TRAINING_COMMAND")
TRAINING_TEXT = re.compile(r"python\d*(\.\d+)?\s|torchrun|accelerate\s+launch|deepspeed")
LONE_AMP = re.compile(r"(?<![&>|])&(?![&>])")  # an & that puts a command in the background (not &&, 2>&1, &>, |&)


def _trains(command: str, depth: int = 0) -> bool:
    """Does ``command`` start a training launch (not one of the bundle's own scripts), also in a
    tmux or screen command's string or a shell's -c string; past MAX_NEST levels, judged by its text."""
    if depth > MAX_NEST:
        return bool(TRAINING_TEXT.search(command))
    try:
        return _items_train(raw_items(command), depth)
    except ValueError:
        return False


def _items_train(items: Optional[list], depth: int) -> bool:
    for pairs, _ in items or []:
        pairs = unbrace(pairs)[1]
        if not pairs:
            continue
        if _launch_at(pairs):
            return True
        sc = shell_c(pairs)
        if sc and _trains(c_string(pairs, sc), depth + 1):
            return True
        words = split_env([w for _, w in pairs])[1]
        if words and os.path.basename(words[0]) in MULTIPLEXERS and \
                any(" " in w and _trains(w, depth + 1) for _, w in pairs[1:]):
            return True
    return False


def _nested_detach(items: Optional[list], depth: int) -> bool:
    """True when a training launch inside a ``( ... )`` subshell, a ``{ ... }`` group or a shell's -c
    string is left running detached: its and-or list ends in ``&`` and no ``wait`` follows in the
    same group or string (the group, or the shell, ends and leaves it running); or, in a -c string,
    it runs under nohup, setsid, disown, tmux -d or screen -dm. The top level of the command itself
    is rule_notified's (depth 0). Groups are counted on a stack, not by recursion; -c strings are
    read to MAX_NEST levels, the one past it judged by its text. Linear in the command's length."""
    # per open group: [it ends (a group, or a -c string's own level), a training & pending, it trains, the
    # and-or list outside it trains]
    stack = [[depth > 0, False, False, False]]
    trains = False  # the and-or list being read trains
    for pairs, op in items or []:
        if pairs and pairs[0][1] == "}" and len(stack) > 1:
            frame = stack.pop()
            if frame[1]:
                return True
            trains = frame[3] or frame[2]
            stack[-1][2] = stack[-1][2] or frame[2]
            pairs = pairs[1:]
        n, pairs = unbrace(pairs)
        for _ in range(n):
            stack.append([True, False, False, trains])
            trains = False
        if pairs:
            if pairs[0][1] == "wait":
                stack[-1][1] = False
            sc, here = shell_c(pairs), False
            if sc is not None:
                inner = c_string(pairs, sc)
                if depth >= MAX_NEST:
                    here = bool(TRAINING_TEXT.search(inner))
                    if here and (detached(inner) or LONE_AMP.search(inner)):
                        return True
                else:
                    try:
                        sub = raw_items(inner)
                    except ValueError:  # an unclosed quote: the shell refuses to run it
                        sub = None
                    if sub is not None:
                        if _nested_detach(sub, depth + 1):
                            return True
                        here = _items_train(sub, depth + 1)
                        if here and detached(inner):
                            return True
            elif stack[-1][0]:
                here = _launch_at(pairs) is not None
            if here:
                trains = stack[-1][2] = True
        if op == "(":
            stack.append([True, False, False, trains])
            trains = False
        elif op == ")" and len(stack) > 1:
            frame = stack.pop()
            if frame[1]:
                return True
            trains = frame[3] or frame[2]
            stack[-1][2] = stack[-1][2] or frame[2]
        elif op == "&":
            if trains and stack[-1][0]:
                stack[-1][1] = True
            trains = False
        elif op in (";", ";;"):
            trains = False
    return any(f[0] and f[1] for f in stack)


def _detaches(command: str) -> bool:
    """Would rule_notified still refuse ``command`` run in the foreground (a fix must not)."""
    nesting = has_nesting(command)
    if not (nesting or LONE_AMP.search(command) or detached(command)):
        return False
    try:
        items = raw_items(command)
    except ValueError:
        return False
    amp = any(op == "&" for _, op in items)
    return ((amp or detached(command)) and (bool(TRAINING_TEXT.search(command)) or _items_train(items, 0))) \
        or bool(nesting and _nested_detach(items, 0))


# ----------------------------------------------------------------------------- the launcher's line as the fix
WRAPPERS = {"nohup", "setsid", "coproc"}  # dropped: the launcher detaches the command itself
MULTIPLEXERS = {"tmux", "screen"}      # the training command is found inside their arguments
SERVICE_RUNNERS = {"systemd-run"}      # ... and among these' words (a unit of its own: dropped as well)
LAUNCH_WINDOW = 16  # words read after a multiplexer's or service runner's word to tell a launch's start
OUT_FLAGS = ("--out", "--output_dir", "--output-dir", "--out-dir", "--out_dir", "--run-dir", "--run_dir")
LAUNCHER_ENV = {"PYTHONUNBUFFERED", *QUIET}  # the launcher sets these itself


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
    head = os.path.basename(rest[0][1]) if rest else ""
    if head in MULTIPLEXERS or head in SERVICE_RUNNERS:  # tmux new -d -s t python train.py, systemd-run --user ...
        # where the launch starts, judged on a window of words after each candidate (linear time: a list of
        # all the words after each one would make 20,000 words of ``systemd-run`` take seconds)
        k = next((k for k in range(1, len(rest)) if not rest[k][1].startswith("-") and not
                  (head in SERVICE_RUNNERS and ENV_ASSIGN.match(rest[k][1])) and
                  _launch([w for _, w in rest[k:k + LAUNCH_WINDOW]])), None)
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
        target = os.path.dirname(unquote(m.group(1)))
        if target:
            return shlex.quote(target)
    return "RUN_DIR"


SEPARATORS = {"&&", "||", ";", "|", "&", "|&", ";;"}
SUBSTITUTION = re.compile(r"[$<>]\(|\(\(")  # $( ), <( ), >( ), (( )): not subshells a fix may rebuild


def detach_fix(command: str, _depth: int = 0, _split: Optional[list] = None) -> Optional[str]:
    """``command`` with each detached training launch started by the launcher instead (its
    nohup, setsid, tmux or screen, its output redirection and its ``&`` dropped; VAR=value words
    other than the ones the launcher sets kept in front), also inside a shell's -c string (the shell
    and its options kept, the string fixed and quoted again) and in ``( )`` or ``{ }`` groups (kept),
    ``disown`` and the ``&`` that ended a launch dropped, the other steps kept. None when it cannot
    be derived (also for a command substitution, or past MAX_NEST levels of -c strings). ``_split``:
    ``raw_items(command)`` when the caller has it."""
    from supervise.act.launch import launcher_line  # the deny path only: the hook's hot path stays small
    if _depth > MAX_NEST or SUBSTITUTION.search(command):
        return None
    try:
        items = raw_items(command) if _split is None else _split
    except ValueError:
        return None
    seq: list = []  # the fixed command: ("c", a simple command's text) and ("o", an operator)
    piped = False   # the pipe after a launch (| tee log) is output capture: the launcher does it
    for pairs, op in items:
        if pairs and piped:
            piped = op in ("|", "|&")
            if op and not piped:
                seq.append(("o", op))
            continue
        if pairs:
            done = _fix_one(pairs, _depth, launcher_line)
            if done is None:
                return None
            text, launched = done
            if text:
                seq.append(("c", text))
            if launched and op in ("|", "|&"):
                piped = True
                continue
        if op:
            seq.append(("o", op))
    text = _join(seq)
    return None if not text or detached(text) or _detaches(text) else text


def _fix_one(pairs: list, depth: int, launcher_line: Callable) -> Optional[tuple[str, bool]]:
    """(this simple command fixed, whether it became a launcher line); ("", False) drops it (disown);
    None when it cannot be fixed."""
    n, pairs = unbrace(pairs)
    brace = "{ " * n
    if not pairs:
        return brace.strip(), False
    words = split_env([w for _, w in pairs])[1]
    head = os.path.basename(words[0]) if words else ""
    if head == "disown":
        return brace.strip(), False
    found = _launch_at(pairs)
    if found is not None:
        env, cmd = found
        if not cmd:
            return None
        line = launcher_line(_run_dir_of(cmd, " ".join(r for r, _ in pairs)), " ".join(r for r, _ in cmd))
        return brace + " ".join([*env, line]), True
    sc = shell_c(pairs)
    if sc is not None and _trains(c_string(pairs, sc), depth + 1):
        if pairs[sc[0]][1] == "eval" and c_string(pairs, sc) != pairs[sc[1]][1]:
            return None  # eval of several words: no one word to put the fixed string in
        inner = detach_fix(pairs[sc[1]][1], depth + 1)  # bash -c 'cd x && python train.py &': its own chain
        if inner is None:
            return None
        kept, dropping = [], False
        for raw, word in pairs[:sc[0]]:  # nohup, setsid (and their options) before the shell go
            if word in WRAPPERS:
                dropping = True
            elif not (dropping and word.startswith("-")):
                dropping = False
                kept.append(raw)
        kept += [r for r, _ in pairs[sc[0]:sc[1]]] + [_requote(inner, pairs[sc[1]][0])]
        skip = False
        for raw, _ in pairs[sc[1] + 1:]:  # $0 and the arguments stay; the output redirections go (the
            if skip:                      # launcher prints the watchdog line to run next)
                skip = False
                continue
            m = REDIRECT.match(raw)
            if m:
                skip = m.group(1) == ""
                continue
            kept.append(raw)
        return brace + " ".join(kept), False
    inner = next((w for _, w in pairs[1:] if " " in w and _trains(w, depth + 1)), None) \
        if head in MULTIPLEXERS else None
    if inner is not None:
        text = detach_fix(inner, depth + 1)  # tmux new -d 'cd /w && python train.py > log 2>&1': its own chain
        return None if text is None else (brace + text, False)
    return brace + " ".join(r for r, w in pairs if w not in WRAPPERS), False


def _requote(text: str, raw: str) -> str:
    """``text`` as one shell word, in the quotes ``raw`` had when that keeps its meaning (double
    quotes keep a $VAR expanding in the outer shell, as it did), else as shlex.quote quotes it."""
    body = raw[1:-1]
    if len(raw) > 1 and raw[0] == raw[-1] == '"' and not any(c in body for c in '"\\') \
            and not any(c in text for c in '"\\`'):
        return f'"{text}"'
    if len(raw) > 1 and raw[0] == raw[-1] == "'" and "'" not in body and "'" not in text:
        return f"'{text}'"
    return shlex.quote(text)


def _join(seq: list) -> str:
    """The fixed command's text: a separator with nothing to join on one side is dropped (the & of
    a launch before a ``)`` or the end), the & of a launch becomes && (the launcher returns at once),
    or ; before a ``}``."""
    out: list = []
    for k, (kind, x) in enumerate(seq):
        if kind == "o" and x in SEPARATORS:
            nxt = seq[k + 1] if k + 1 < len(seq) else None
            if not out or out[-1] == ("o", "(") or (out[-1][0] == "o" and out[-1][1] in SEPARATORS) or nxt is None \
                    or nxt == ("o", ")") or (nxt[0] == "o" and nxt[1] in SEPARATORS):
                continue
            if x == "&":
                x = ";" if nxt[0] == "c" and nxt[1].startswith("}") else "&&"
        out.append((kind, x))
    text: list = []  # pieces; a separator's trailing blank is its own piece, so a ) can take its place
    for kind, x in out:
        last = text[-1] if text else ""
        if kind == "c":
            text += [x] if not text or last == " " or last.endswith("(") else [" ", x]
        elif x == "(":
            text.append(" (" if last.endswith("(") else "(")  # never ((: that is arithmetic
        elif x == ")":
            text[-1:] = [")"] if last == " " else [last, ")"]
        else:
            text += [";" if x == ";" else f" {x}", " "]
    return "".join(text).strip()
