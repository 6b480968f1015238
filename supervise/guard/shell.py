"""The one split every guard rule reads: a regex lexer (``tokens``; ``shlex`` is quadratic in the
length of a word), the simple commands of a chain, a shell's ``-c`` string and ``( )`` / ``{ }``
groups counted on a stack to ``MAX_NEST`` levels, the tool call (``Call``) and the deny line.
Standard library only: hot path."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Optional


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


# Each operator is one token (&&, ||, ;;, |&, or one of ;&|()), so ``(python train.py &)`` ends in the
# operators & and ), except the & of a redirection (2>&1, >&2, &>log), which stays in its word:
# ``python train.py > log 2>&1`` runs in the foreground.
RAW_TOKEN = re.compile(r"""&&|\|\||;;|\|&|[;|()]|&(?!>)|(?:[^ \t\r\n;&|()<>'"\\]+|[<>]+&?|&>+|'[^']*'|"[^"\\]*(?:\\.[^"\\]*)*"|\\.)+|['"\\]""", re.S)
_QUOTED_PART = re.compile(r"""'([^']*)'|"([^"\\]*(?:\\.[^"\\]*)*)"|\\(.)|([^'"\\]+)""", re.S)
_DOUBLE_ESCAPE = re.compile(r'\\([\\"])')


def unquote(word: str) -> str:
    return "".join(m[1] if m[1] is not None else _DOUBLE_ESCAPE.sub(r"\1", m[2]) if m[2] is not None else
                   m[3] if m[3] is not None else m[4] for m in _QUOTED_PART.finditer(word))


def tokens(command: str) -> list[str]:
    """Words and operators as ``shlex.shlex(command, posix=True, punctuation_chars=";&|()")`` with
    ``whitespace_split`` splits them (quotes removed, a quoted part kept in its word), except that
    each operator is its own token (shlex makes one token of a run such as ``&)``) and a
    redirection's ``&`` stays in its word (``2>&1``); in linear time: one regex pass, quotes
    undone only in the words that hold one. ValueError on an unclosed quote or a final backslash."""
    out = RAW_TOKEN.findall(command)
    for i, t in enumerate(out):
        if "'" in t or '"' in t or "\\" in t:
            if t in ("'", '"', "\\"):  # the lone character no other branch could take
                raise ValueError("No escaped character" if t == "\\" else "No closing quotation")
            out[i] = unquote(t)
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


def command_items(call: Call) -> Optional[list]:
    """raw_items of the call's command, split once per call; None when it does not split."""
    if "items" not in call.memo:
        try:
            call.memo["items"] = raw_items(call.command)
        except ValueError:
            call.memo["items"] = None
    return call.memo["items"]


def command_parts(call: Call) -> Optional[list]:
    """simple_commands of the call's command (from the same split as command_items); None when it does not split."""
    if "parts" not in call.memo:
        items = command_items(call)
        call.memo["parts"] = None if items is None else [([w for _, w in pairs], op) for pairs, op in items if pairs]
    return call.memo["parts"]


def split_env(words: list[str]) -> tuple[dict, list[str]]:
    """Leading VAR=value assignments (also after ``env``, and inside a ``{ ... }`` group) and the rest."""
    env, i = {}, 0
    while i < len(words) and words[i] == "{":
        i += 1
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


def deny(rule: str, why: str, fix: Optional[str]) -> str:
    reason = f"[{rule}] {why}"
    if fix and len(fix) > MAX_FIX:
        return reason + f" (The corrected command is {len(fix):,} characters, too long to show: put the steps in a " \
                        "script file and launch that.)"
    return reason + (f" Run instead: {fix}" if fix else "")


# ----------------------------------------------------------------------------- shells' -c strings and subshells
MAX_NEST = 3  # levels of bash -c strings read; the one past it is judged by its text alone (a bounded recursion)
SHELLS = {"bash", "sh", "zsh", "dash", "ksh", "ash"}
SHELL_ARG_OPTS = {"-o", "+o", "-O", "+O", "--rcfile", "--init-file"}  # a shell's options that take a value
PREFIXES = {"nohup", "setsid", "exec", "time", "nice", "command", "coproc"}  # words that run the command after them
ENV_ARG_OPTS = {"-u", "--unset", "-C", "--chdir"}
# what a subshell, a { } group or a shell's -c string needs in the text (a cheap test before the walk)
NESTING_TEXT = re.compile(r"""[({]|(?:^|[\s/;&|'"])(?:ba|z|da|k|a)?sh['"]?\s|(?:^|[\s;&|])eval\s""")


def has_nesting(text: str) -> bool:
    """Might ``text`` hold a subshell, a { } group or a shell's -c string (or eval's string): NESTING_TEXT,
    searched only when the plain substring tests (fast) leave it open."""
    return "(" in text or "{" in text or (("sh" in text or "eval" in text) and bool(NESTING_TEXT.search(text)))


def shell_c(pairs: list) -> Optional[tuple[int, int]]:
    """(where the shell's word is, where its -c string is) when this simple command runs a shell's
    -c string: ``bash -c STRING``, also sh, zsh, dash, ksh by any path, after VAR=value, env, nohup,
    setsid, exec, time, nice, with -c among other options (``-lc``, ``--login -c``); also ``eval WORDS``
    (this shell runs its words joined as a command: read like a -c string, see c_string); else None."""
    for _, first in pairs:
        if first != "{":
            break
    else:
        return None
    if not (first in PREFIXES or first in ("env", "eval") or first.rpartition("/")[2] in SHELLS
            or ENV_ASSIGN.match(first)):
        return None  # the common case, decided on one word
    words = [w for _, w in pairs]
    i, n = 0, len(words)
    while i < n and words[i] == "{":
        i += 1
    while i < n:
        w = words[i]
        if ENV_ASSIGN.match(w):
            i += 1
        elif w == "env" or w in PREFIXES:
            i += 1
            while i < n and words[i].startswith("-") and words[i] != "-":
                i += 2 if w == "env" and words[i] in ENV_ARG_OPTS else 1
        else:
            break
    if i + 1 < n and words[i] == "eval":  # eval 'python train.py &': the words after it (c_string joins them)
        return i, i + 1
    if i >= n or os.path.basename(words[i]) not in SHELLS:
        return None
    j, c = i + 1, False
    while j < n:
        w = words[j]
        if w == "--":
            j += 1
            break
        if w in SHELL_ARG_OPTS:
            j += 2
        elif w.startswith("--"):
            j += 1
        elif len(w) > 1 and w[0] in "-+" and w[1:].isalpha():
            c = c or (w[0] == "-" and "c" in w)
            j += 1
        else:
            break
    return (i, j) if c and j < n else None


def c_string(pairs: list, sc: tuple[int, int]) -> str:
    """The command text that shell_c's simple command runs: its shell's -c string, or the words eval
    joins with blanks (``eval python train.py '&'`` runs ``python train.py &``), redirections left out."""
    i, j = sc
    if pairs[i][1] != "eval":
        return pairs[j][1]
    words, skip = [], False
    for raw, word in pairs[j:]:
        m = None if skip else REDIRECT.match(raw)
        if skip or m:
            skip = bool(m) and m.group(1) == ""
            continue
        words.append(word)
    return " ".join(words)


def unbrace(pairs: list) -> tuple[int, list]:
    """How many ``{`` open this simple command, and its words after them."""
    n = 0
    while n < len(pairs) and pairs[n][1] == "{":
        n += 1
    return n, pairs[n:]
REDIRECT = re.compile(r"^(?:\d*|&)(?:>>?|<)&?(.*)$")


def raw_items(command: str) -> list[tuple[list[tuple[str, str]], str]]:
    """Each simple command with each word's raw text (its quoting kept) beside its value, and the
    operator that follows it: [([(raw, word), ...], operator)]; an operator that follows no command
    (a subshell's ``(``, the ``&&`` after a ``)``) comes as ([], operator). ValueError as ``tokens``."""
    out, cur = [], []
    for raw in RAW_TOKEN.findall(command):
        if raw in OPERATORS:
            out.append((cur, raw))
            cur = []
        elif "'" in raw or '"' in raw or "\\" in raw:
            if raw in ("'", '"', "\\"):  # the lone character no other branch could take
                raise ValueError("unbalanced quoting")
            cur.append((raw, unquote(raw)))
        else:
            cur.append((raw, raw))
    if cur:
        out.append((cur, ""))
    return out
