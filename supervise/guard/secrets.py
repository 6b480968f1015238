"""Secrets: reading or copying a dotenv file, a cloud credential file, a token a CLI prints or a
secret variable is refused (the guard keeps them out of the transcript). Standard library only:
hot path."""
from __future__ import annotations

import os
import re
import shlex
from typing import Optional

from supervise.guard.shell import (
    Call, ENV_ASSIGN, MAX_NEST, REDIRECT, c_string, command_items, command_parts, deny, has_nesting,
    raw_items, shell_c)
from supervise.vocabulary import PYTHON

CREDENTIALS = ("~/.git-credentials", "~/.netrc", "~/.aws/credentials", "~/.config/gh/hosts.yml",
               "~/.cache/huggingface/token", "~/.huggingface/token", "~/.ssh/id_", "~/.docker/config.json",
               "~/.kaggle/kaggle.json", "~/.config/huggingface/token",
               # gcloud's application-default credentials and its logins' tokens
               "~/.config/gcloud/application_default_credentials.json", "~/.config/gcloud/credentials.db",
               "~/.config/gcloud/access_tokens.db", "~/.config/gcloud/legacy_credentials",
               # the Azure CLI's token caches and service principals' secrets (not azureProfile.json: names, ids)
               "~/.azure/accessTokens.json", "~/.azure/msal_token_cache.json", "~/.azure/msal_token_cache.bin",
               "~/.azure/service_principal_entries.json", "~/.azure/service_principal_entries.bin")
SECRET_VAR = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD", re.I)


# ----------------------------------------------------------------------------- dotenv files, cloud tokens
# A dotenv file: .env or .env.<something> (.env.local, config/.env.production). Its templates hold no
# secrets (they are committed to be copied): .env.example, .env.sample, .env.template ... are not one.
DOTENV_TEMPLATES = {"example", "sample", "template", "dist", "defaults", "tmpl", "tpl"}
READERS = {"cat", "tac", "nl", "less", "more", "most", "bat", "batcat", "head", "tail", "grep", "egrep", "fgrep",
           "rg", "ag", "sed", "awk", "gawk", "mawk", "cut", "sort", "uniq", "strings", "xxd", "od", "hexdump",
           "base64", "base32", "diff", "jq", "column", "paste", "fold", "tar", "zip"}  # print or pack a file
COPIERS = {"cp", "scp", "rsync", "install"}  # all but the last path are read (cp .env.example .env writes one)
PROGRAM_FIRST = {"grep", "egrep", "fgrep", "rg", "ag", "sed", "awk", "gawk", "mawk", "jq"}  # 1st word: the pattern
PROGRAM_FLAGS = ("-e", "-f", "--regexp", "--file", "--expression")  # ... unless given by a flag
# commands that run the command after them: {name: (their options that take the next word as a value, how many
# plain words come before the command: timeout's duration, taskset's CPU mask)}
RUNNERS = {
    "sudo": ({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "--user", "--group", "--chdir", "--prompt",
              "--role", "--type", "--other-user", "--host", "--close-from", "--command-timeout"}, 0),
    "doas": ({"-u", "-C"}, 0), "env": ({"-u", "--unset", "-C", "--chdir"}, 0), "nice": ({"-n", "--adjustment"}, 0),
    "timeout": ({"-s", "--signal", "-k", "--kill-after"}, 1), "stdbuf": ({"-i", "-o", "-e"}, 0),
    "ionice": ({"-c", "-n", "--class", "--classdata"}, 0), "taskset": (set(), 1), "time": ({"-f", "-o"}, 0),
    "watch": ({"-n", "--interval"}, 0), "xargs": ({"-I", "-n", "-P", "-d", "-L", "-s", "-E", "-a"}, 0),
    "command": (set(), 0), "exec": ({"-a"}, 0), "nohup": (set(), 0), "setsid": (set(), 0),
}
# git commands that print a file's content (git diff .env, git show HEAD:.env, git log -p -- .env), and the
# flags that make them print names or counts instead (unless a patch is asked for too)
_NAMES_ONLY = {"--stat", "--numstat", "--shortstat", "--name-only", "--name-status", "--summary", "--dirstat",
               "--quiet", "--no-patch", "-s"}
GIT_PRINTS = {"diff": _NAMES_ONLY, "show": _NAMES_ONLY, "format-patch": _NAMES_ONLY, "log": set(),
              "whatchanged": set(), "blame": set(), "annotate": set(), "cat-file": {"-t", "-s", "-e"},
              "grep": {"-q", "--quiet", "-l", "-L", "-c", "--count", "--name-only", "--files-with-matches",
                       "--files-without-match"}}
GIT_PATCH = re.compile(r"^(-p|-u|--patch(-with-stat|-with-raw)?|-U\d*|--unified(=.*)?)$")
GIT_OWN_VALUE_OPTS = {"-C", "-c", "--git-dir", "--work-tree", "--namespace"}
CLOUD_TOKEN_VERBS = {"gcloud": {"print-access-token", "print-identity-token", "print-refresh-token", "config-helper"},
                     "az": {"get-access-token"}}
DOTENV_LITERAL = re.compile(r"""['"]([^'"\s]*)['"]""")
CLOUD_KEY_VAR = re.compile(r"\$\{?GOOGLE_APPLICATION_CREDENTIALS\b")  # the path of a service account's key


def is_dotenv(word: str) -> bool:
    """Is ``word`` the path of a dotenv file (.env, .env.local, config/.env, ~/proj/.env.production,
    a glob .env*), not a template (.env.example, .env.sample, .env.template) or a look-alike (.envrc)."""
    name = word.rstrip("/").rpartition("/")[2]
    if name == ".env":
        return True
    if name.startswith(".env."):
        return name.rpartition(".")[2].lower() not in DOTENV_TEMPLATES
    return name.startswith(".env") and name[4:5] in ("*", "?", "[")


def _read_files(exe: str, args: list[str]) -> list[str]:
    """The paths a reading or copying command reads: its words, less its options, the pattern or
    program of grep, sed and awk, output redirections' targets, and a copy's destination; an input
    redirection's target is read; curl's @file, -T file and file:// URL, wget's --post-file= are
    reads too."""
    out, plain, i = [], [], 0
    while i < len(args):
        a = args[i]
        m = REDIRECT.match(a)
        if m:  # > .env writes it; < .env reads it
            target = m.group(1) or (args[i + 1] if i + 1 < len(args) else "")
            if ">" not in a[:len(a) - len(m.group(1))]:
                out.append(target)
            i += 1 if m.group(1) else 2
            continue
        if exe in ("curl", "wget"):
            if a.startswith("file://"):  # curl file:///srv/app/.env prints it
                out.append(a[7:])
            elif "@" in a:
                out.append(a.partition("@")[2].split(";")[0])
            elif a in ("-T", "--upload-file") and i + 1 < len(args):
                out.append(args[i + 1])
            elif a.startswith(("--post-file=", "--body-file=")):
                out.append(a.partition("=")[2])
        elif a.startswith("-"):
            if "=" in a:
                out.append(a.partition("=")[2])  # --file=.env
        else:
            plain.append(a)
        i += 1
    if exe in PROGRAM_FIRST and plain and not any(a.startswith(PROGRAM_FLAGS) for a in args):
        plain = plain[1:]
    if exe in COPIERS:
        plain = plain[:-1]
    return out + plain if exe not in ("curl", "wget") else out


def unwrap(words: list[str]) -> list[str]:
    """The command a simple command runs: its leading ``{``, VAR=value words and runners stripped
    (sudo -u root, doas, env -i VAR=1, nice -n 5, timeout 5, stdbuf -oL, xargs, ...: each with its
    options, their values, its VAR=value words and its plain words before the command); a runner
    with no command after it is the command (``env`` alone prints the environment)."""
    i = 0
    while i < len(words) and (words[i] == "{" or ENV_ASSIGN.match(words[i])):
        i += 1
    words = words[i:]
    while words:
        spec = RUNNERS.get(os.path.basename(words[0]))
        if spec is None:
            break
        takes, plain = spec
        i = 1
        while i < len(words) and words[i].startswith("-") and words[i] != "-":
            if words[i] == "--":
                i += 1
                break
            i += 2 if words[i] in takes else 1
        while i < len(words) and ENV_ASSIGN.match(words[i]):  # sudo VAR=1 CMD, env VAR=1 CMD
            i += 1
        i += plain
        if i >= len(words):
            break
        words = words[i:]
    return words


def _git_shown(args: list[str]) -> list[str]:
    """The paths whose content this git command prints (git diff .env, git show HEAD:.env, git log -p
    -- .env, git blame .env, git cat-file -p HEAD:.env, git grep KEY -- .env); [] when it prints only
    names or counts (--stat, --name-only, -q), or is no command that prints a file."""
    i = 0
    while i < len(args) and args[i].startswith("-"):  # git -C DIR --no-pager diff ...
        i += 2 if args[i] in GIT_OWN_VALUE_OPTS else 1
    if i >= len(args) or args[i] not in GIT_PRINTS:
        return []
    verb, rest = args[i], args[i + 1:]
    patch = any(GIT_PATCH.match(a) for a in rest)
    if not patch and (verb in ("log", "whatchanged") or any(a.partition("=")[0] in GIT_PRINTS[verb] for a in rest)):
        return []  # git log .env lists commits; git diff --stat .env counts lines
    plain = [a for a in rest if not a.startswith("-")]
    if verb == "grep" and not any(a.startswith(("-e", "-f")) for a in rest):
        plain = plain[1:]  # the pattern
    return [a.partition(":")[2] if ":" in a else a for a in plain]


def _secret_read(words: list[str]) -> Optional[str]:
    """The deny reason when this simple command prints or copies a dotenv file, a cloud key's file
    (``$GOOGLE_APPLICATION_CREDENTIALS``), or asks a cloud CLI for a live token, also through a runner
    (sudo -u root cat .env) and git (git diff .env); else None."""
    words = unwrap(words)
    if not words:
        return None
    exe, args = os.path.basename(words[0]), words[1:]
    verbs = CLOUD_TOKEN_VERBS.get(exe)
    if verbs and any(a in verbs for a in args):
        verb = next(a for a in args if a in verbs)
        return (f"{exe} {verb} prints a live access token into the transcript: do not; if a call fails with 401, "
                "tell the user the login is missing or expired.")
    files: list[str] = []
    if exe == "git":
        files = _git_shown(args)
    elif exe in READERS or exe in COPIERS or exe in ("curl", "wget"):
        if exe == "sed" and any(a.startswith(("-i", "--in-place")) for a in args):
            return None  # edits it in place: nothing is printed
        if exe in ("grep", "egrep", "fgrep", "rg") and any(a in ("-q", "--quiet", "--silent") or
                                                           (a[:1] == "-" and a[1:2] != "-" and "q" in a) for a in args):
            return None  # grep -q KEY .env: is it set? nothing is printed
        files = _read_files(exe, args)
    elif PYTHON.match(words[0]) and "-c" in args[:-1]:  # python -c "print(open('.env').read())"
        code = args[args.index("-c") + 1]
        reads = "open(" in code or "read_" in code or "dotenv_values" in code
        files = DOTENV_LITERAL.findall(code) if reads else []
    elif exe == "dotenv" or (PYTHON.match(words[0]) and args[:2] == ["-m", "dotenv"]):
        verb = next((a for a in args if a in ("list", "get", "run", "set", "unset")), "")
        if verb in ("list", "get"):  # dotenv run -- CMD is a use: it passes the values on, unprinted
            return (f"dotenv {verb} prints the values of a dotenv file, which holds someone's credentials: do not; "
                    "if a push or download fails with 401, tell the user the token is missing or revoked.")
    for f in files:
        if is_dotenv(f):
            source = _source_word(f if "/" in f else "./" + f)  # . FILE without a / searches PATH first
            return (f"{f} is a dotenv file: it holds someone's credentials: do not read or copy it (to pass it to "
                    f"a program: set -a && . {source} && set +a && COMMAND, or docker's --env-file); if a push or "
                    "download fails with 401, tell the user the token is missing or revoked.")
        if CLOUD_KEY_VAR.match(f):
            return ("$GOOGLE_APPLICATION_CREDENTIALS names a service account's key: do not read it; if a call fails "
                    "with 401, tell the user the key is missing or revoked.")
    return None


HOME_FORMS = ("~/", "$HOME/", "${HOME}/")


def _source_word(path: str) -> str:
    """``path`` as a shell word that names the same file: quoted, but its leading ~/ or $HOME/ left bare
    (quoted, they would not expand)."""
    home = next((h for h in HOME_FORMS if path.startswith(h)), "")
    return home + shlex.quote(path[len(home):]) if home and len(path) > len(home) else shlex.quote(path)


def rule_no_credential_hunting(call: Call) -> Optional[str]:
    if call.tool != "Bash":
        return None
    text = call.command
    home = call.env.get("HOME") or os.path.expanduser("~")
    for cred in CREDENTIALS:
        tail = cred[2:]
        for form in (cred, "$HOME/" + tail, "${HOME}/" + tail, home + "/" + tail):
            if form in text:
                return deny("no_credential_hunting", f"{cred} holds someone's credentials: do not read them; if a "
                             "push or download fails with 401, tell the user the token is missing or revoked.", None)
    if re.search(r"\bgit\s+credential(-\w+)?\s+(fill|get)\b", text):
        return deny("no_credential_hunting", "git credential fill prints stored secrets: tell the user instead.", None)
    secret = _secret_in(command_parts(call) or [])
    if secret is None and has_nesting(text):  # bash -c 'cat .env', bash -c 'echo $HF_TOKEN', eval 'cat .env'
        secret = _secret_inside(command_items(call), 0)
    return deny("no_credential_hunting", secret, None) if secret else None


def _secret_in(parts: list[tuple[list[str], str]]) -> Optional[str]:
    """The deny reason when a simple command of this chain (``simple_commands``' shape) reads a secret
    file (_secret_read) or prints a secret variable (echo $HF_TOKEN, printenv GITHUB_TOKEN, env | grep
    -i token), also through a runner (sudo, env, nice, timeout); else None."""
    for i, (words, op) in enumerate(parts):
        words = unwrap(words)
        if not words:
            continue
        secret = _secret_read(words)
        if secret:
            return secret
        exe = os.path.basename(words[0])
        shown = []
        if exe in ("echo", "printf"):
            shown = [v for w in words[1:] for v in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", w)]
        elif exe == "printenv":
            shown = words[1:] or (["*"] if op in ("|", "|&") and i + 1 < len(parts)
                                  and SECRET_VAR.search(" ".join(parts[i + 1][0])) else [])
        elif exe in ("env", "set", "export") and len(words) == 1 and op in ("|", "|&") and i + 1 < len(parts):
            shown = ["*"] if SECRET_VAR.search(" ".join(parts[i + 1][0])) else []
        if any(v == "*" or SECRET_VAR.search(v) for v in shown):
            return "Printing secret variables puts them in the transcript: tell the user what is missing instead."
    return None


def _secret_inside(items: Optional[list], depth: int) -> Optional[str]:
    """_secret_in of the simple commands inside the shells' -c strings (and eval's) of ``items``, to
    MAX_NEST levels."""
    for pairs, _ in items or []:
        sc = shell_c(pairs) if pairs and depth < MAX_NEST else None
        if sc is None:
            continue
        try:
            sub = raw_items(c_string(pairs, sc))
        except ValueError:  # an unclosed quote: the shell runs nothing
            continue
        secret = _secret_in([([w for _, w in inner], op) for inner, op in sub if inner]) or \
            _secret_inside(sub, depth + 1)
        if secret:
            return secret
    return None
