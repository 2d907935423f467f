#!/usr/bin/python3
"""Documentation that runs: every command block of README.md and docs/*.md, run as written.

A command block is a fenced code block whose info string is `bash`, `sh` or `console`. Every one
is run by bash in a scratch copy of the repository (symlinks to the checkout, `build` -> the build
directory), the blocks of one file in order in one directory, so a block may use the files an
earlier block of the same document wrote. A block fails the test when it exits with a status other
than the expected one (0 unless declared) or when its output lacks a declared key line.

An HTML comment right above a block (blank lines between are allowed) changes what is run:

    <!-- docs-test: skip: REASON -->                not run; the reason is printed
    <!-- docs-test: shorten: REASON                 run in a shortened form: each `replace` is a
         replace: OLD => NEW                        literal substitution in the block's text that
         expect: REGEX -->                          must match at least once
    <!-- docs-test: expect: REGEX -->                the block's stdout + stderr must match REGEX
                                                    (Python re, multiline; may be repeated)
    <!-- docs-test: reject: REGEX -->                no line of the output may match REGEX
    <!-- docs-test: exit: N -->                      the block must exit with status N
    <!-- docs-test: needs: torch -->                 skipped when the build has no libtorch
                                                    (no `sluice train`); CI's build has it
    <!-- docs-test: slow -->                         run only by the slow test (`--slow`)
    <!-- docs-test: known-failing: REASON -->        run; it must fail (exit != expected); passes
                                                    are reported so the mark can be removed

Above a ```json block, `<!-- docs-test: same-as: FILE -->` checks that the block and the
repository's FILE hold the same JSON value (an example quoted from examples/ stays the file).

Items are one per line (or separated by ` ;; `); a line that starts with no item's name continues
the previous item. A fenced block without an info string whose first
line looks like a command is an error: every command in the docs is either run or declared not
run. The docs must not cite files outside the repository (`../shared`, absolute /work paths).

Inline commands in the prose (a `sluice SUBCOMMAND --flag ...` code span) are not run, but every
flag they name must be one that subcommand's `--help` lists.

Usage: docs_test.py --source DIR --build DIR [--slow] [--only FILE] [--list]
Prints the commands run, shortened and skipped (with the reasons); exit status 1 on a failure.
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

KEYS = {"skip", "shorten", "replace", "expect", "reject", "needs", "exit", "timeout", "slow",
        "known-failing"}
COMMAND_LANGS = {"bash", "sh", "console", "shell"}
# First words that make an untagged block a command block (that must then be tagged).
COMMAND_START = re.compile(
    r"^\s*(\$ |sluice |\./build|build/|cmake |ctest |ninja |bash |bench/|scripts/|"
    r"[A-Z_]+=\S* )")
DIRECTIVE = re.compile(r"<!--\s*docs-test:(.*?)-->", re.S)
# Files a clone does not have: the project's private notes beside the checkout.
OUTSIDE_REFS = re.compile(r"\.\./shared|/work/|(?<![\w/.-])reference/[\w-]+\.md|"
                          r"(?<![\w/.-])design/[A-Z]+\.md")


class Block:
    def __init__(self, path, line, lang, text, directive):
        self.path, self.line, self.lang, self.text = path, line, lang, text
        self.skip = None
        self.shorten = None
        self.replaces = []
        self.expects = []
        self.rejects = []
        self.needs = None
        self.exit = 0
        self.slow = False
        self.known_failing = None
        self.timeout = 600
        self.errors = []
        if directive is not None:
            self.parse_directive(directive)

    def where(self):
        return f"{self.path}:{self.line}"

    def parse_directive(self, body):
        items = []
        for raw in body.replace(" ;; ", "\n").split("\n"):
            item = raw.strip()
            if not item:
                continue
            key = item.partition(":")[0].strip()
            if items and key not in KEYS and item != "slow":
                items[-1] += " " + item  # a long value continues on the next line
            else:
                items.append(item)
        for item in items:
            key, _, value = item.partition(":")
            key, value = key.strip(), value.strip()
            if key == "skip":
                self.skip = value
            elif key == "shorten":
                self.shorten = value
            elif key == "replace":
                m = re.match(r"(.*?) =>(?: (.*))?$", value)
                if not m:
                    self.errors.append(f"'replace: {value}' lacks ' => '")
                else:
                    self.replaces.append((m.group(1), m.group(2) or ""))
            elif key == "expect":
                self.expects.append(value)
            elif key == "reject":
                self.rejects.append(value)
            elif key == "needs":
                if value != "torch":
                    self.errors.append(f"'needs: {value}': allowed: torch")
                self.needs = value
            elif key == "exit":
                self.exit = int(value)
            elif key == "timeout":
                self.timeout = int(value)
            elif key == "slow" and not value:
                self.slow = True
            elif key == "known-failing":
                self.known_failing = value
            else:
                self.errors.append(f"unknown docs-test item '{item}' (allowed: skip, shorten, "
                                   "replace, expect, reject, needs, exit, timeout, slow, known-failing)")
        for what, value in (("skip", self.skip), ("shorten", self.shorten),
                            ("known-failing", self.known_failing)):
            if value is not None and not value:
                self.errors.append(f"'{what}' needs a reason")
        if self.replaces and self.shorten is None:
            self.errors.append("'replace' without 'shorten: REASON'")
        if self.shorten is not None and not self.replaces:
            self.errors.append("'shorten' without any 'replace: OLD => NEW'")

    def commands(self):
        """The block's logical commands: continuation lines joined, comments dropped."""
        cmds, cur = [], ""
        for line in self.text.split("\n"):
            stripped = line.strip()
            if not cur and (not stripped or stripped.startswith("#")):
                continue
            cur += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
            if not line.rstrip().endswith("\\"):
                cmds.append(cur.strip())
                cur = ""
        if cur:
            cmds.append(cur.strip())
        return cmds

    def runnable_text(self, errors=None):
        text = self.text
        for old, new in self.replaces:
            if old not in text and errors is not None:
                errors.append(f"'replace: {old} => {new}': '{old}' is not in the block")
            text = text.replace(old, new)
        if self.lang == "console":
            text = "\n".join(l[2:] for l in text.split("\n") if l.startswith("$ "))
        return text


def parse(path, rel):
    """The fenced blocks of one markdown file, with the directive above each."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, problems, same_as = [], [], []
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+)(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3)
        start = i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        # The directive: an HTML comment ending on the last non-blank line above the fence.
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        directive = None
        if j >= 0 and lines[j].strip().endswith("-->"):
            k = j
            while k >= 0 and "<!--" not in lines[k]:
                k -= 1
            dm = DIRECTIVE.search("\n".join(lines[k:j + 1]))
            if dm:
                directive = dm.group(1)
        text = "\n".join(body)
        if lang in COMMAND_LANGS:
            blocks.append(Block(rel, start + 1, lang, text, directive))
        elif lang == "json" and directive is not None and directive.strip().startswith("same-as:"):
            same_as.append((f"{rel}:{start + 1}", directive.strip()[len("same-as:"):].strip(),
                            text))
        elif directive is not None:
            problems.append(f"{rel}:{start + 1}: docs-test directive above a block whose info "
                            f"string '{lang}' is not a command language ({sorted(COMMAND_LANGS)})")
        elif not lang:
            first = next((l for l in body if l.strip() and not l.strip().startswith("#")), "")
            if COMMAND_START.match(first):
                problems.append(f"{rel}:{start + 1}: an untagged block that starts with a command "
                                f"('{first.strip()[:60]}'): tag it ```bash (and run it or "
                                "declare why not) or ```text if it is not a command")
    return blocks, problems, same_as


INLINE_COMMAND = re.compile(r"`((?:\./)?(?:build[\w-]*/)?sluice\s[^`]*)`")


class HelpIndex:
    """Flags and subcommands of each `sluice ... --help`, read with scripts/cli_doc.py's parser."""

    def __init__(self, source, sluice):
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            "cli_doc", os.path.join(source, "scripts", "cli_doc.py"))
        self.cli_doc = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.cli_doc)
        self.sluice = sluice
        self.cache = {}

    def get(self, path):
        key = tuple(path)
        if key not in self.cache:
            p = subprocess.run([self.sluice] + path + ["--help"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
            if p.returncode != 0:
                self.cache[key] = None
            else:
                _, _, sections = self.cli_doc.parse(p.stdout.decode("utf-8", "replace"))
                flags = set()
                for left, _ in sections.get("Options", []):
                    names = self.cli_doc.split_option(left)[0]
                    flags.update(n for n in names.split(",") if n.startswith("--"))
                self.cache[key] = (flags, set(self.cli_doc.subcommands(sections)))
        return self.cache[key]


def check_inline(rel, text, index, have_torch):
    """Problems of the inline `sluice ...` commands of one file: flags --help does not list."""
    problems, checked = [], 0
    for m in INLINE_COMMAND.finditer(text):
        tokens = m.group(1).split()[1:]
        path = []
        top = index.get([])
        if top is None:
            break
        while tokens and index.get(path) and tokens[0] in index.get(path)[1]:
            path.append(tokens.pop(0))
        if not path:
            continue
        if path[0] in ("train", "profile") and not have_torch:
            continue
        flags = index.get(path)[0]
        line = text.count("\n", 0, m.start()) + 1
        checked += 1
        for t in tokens:
            if not t.startswith("--") or t in ("--", "--...") or t.endswith("..."):
                continue
            flag = re.sub(r"[=\[\]\)(,.;:].*$", "", t)
            if flag not in flags:
                problems.append(f"{rel}:{line}: `{m.group(1)[:80]}` uses {flag}, which "
                                f"`sluice {' '.join(path)} --help` does not list")
    return problems, checked


def make_workdir(source, build, root):
    os.makedirs(root)
    for name in os.listdir(source):
        if name in ("build", ".git"):
            continue
        os.symlink(os.path.join(source, name), os.path.join(root, name))
    os.symlink(build, os.path.join(root, "build"))


def run_block(block, workdir, env):
    failures = []
    script = ("set -eo pipefail\n" + block.runnable_text(failures) +
              "\nfor _job in $(jobs -p); do wait \"$_job\" || exit $?; done\n")
    t0 = time.time()
    try:
        p = subprocess.run(["bash", "-c", script], cwd=workdir, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=block.timeout)
        out, rc = p.stdout.decode("utf-8", "replace"), p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace")
        rc = None
    dt = time.time() - t0
    if rc is None:
        failures.append(f"did not finish in {block.timeout} s")
    elif rc != block.exit:
        failures.append(f"exit status {rc}, expected {block.exit}")
    for pattern in block.expects:
        if not re.search(pattern, out, re.M):
            failures.append(f"output lacks a line matching /{pattern}/")
    for pattern in block.rejects:
        m = re.search(pattern, out, re.M)
        if m:
            line = out[out.rfind("\n", 0, m.start()) + 1:].split("\n")[0]
            failures.append(f"output has a line matching /{pattern}/: {line[:200]}")
    return failures, out, dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", required=True, help="the repository root")
    ap.add_argument("--build", required=True, help="the build directory (./build in the docs)")
    ap.add_argument("--slow", action="store_true", help="run the blocks marked slow instead")
    ap.add_argument("--only", help="only this markdown file (relative to the source)")
    ap.add_argument("--list", action="store_true", help="list the blocks and what is done")
    args = ap.parse_args()
    source, build = os.path.realpath(args.source), os.path.realpath(args.build)

    files = ["README.md", "src/README.md"] + sorted(os.path.relpath(p, source)
                                   for p in glob.glob(os.path.join(source, "docs", "*.md")))
    if args.only:
        files = [args.only]
    problems = []
    all_blocks = []
    json_checked = 0
    for rel in files:
        path = os.path.join(source, rel)
        text = open(path, encoding="utf-8").read()
        for n, line in enumerate(text.split("\n"), 1):
            if OUTSIDE_REFS.search(line):
                problems.append(f"{rel}:{n}: cites a file outside the repository: {line.strip()}")
        blocks, p, same_as = parse(path, rel)
        problems += p
        all_blocks += blocks
        for where, other, text in same_as:
            try:
                if json.loads(text) != json.load(open(os.path.join(source, other))):
                    problems.append(f"{where}: the example differs from {other}")
                else:
                    json_checked += 1
            except (OSError, ValueError) as e:
                problems.append(f"{where}: same-as {other}: {e}")
    for b in all_blocks:
        problems += [f"{b.where()}: {e}" for e in b.errors]
    help_text = subprocess.run([os.path.join(build, "sluice"), "--help"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT).stdout.decode("utf-8", "replace")
    have_torch = re.search(r"^\s+train\b", help_text, re.M) is not None
    index = HelpIndex(source, os.path.join(build, "sluice"))
    inline_checked = 0
    for rel in files:
        p, n = check_inline(rel, open(os.path.join(source, rel), encoding="utf-8").read(), index,
                            have_torch)
        problems += p
        inline_checked += n

    if args.list:
        for b in all_blocks:
            what = ("skip: " + b.skip if b.skip is not None else
                    "slow" if b.slow else "shorten: " + b.shorten if b.shorten else "run")
            print(f"{b.where()}: {len(b.commands())} command(s), {what}")
        for p in problems:
            print(f"problem: {p}")
        return 1 if problems else 0

    env = dict(os.environ)
    env["PATH"] = build + os.pathsep + env.get("PATH", "")
    env.setdefault("MASTER_PORT", "29611")
    scratch = tempfile.mkdtemp(prefix="sluice-docs-test-")
    counts = {"run": 0, "shortened": 0, "skipped": 0, "known-failing": 0, "other-suite": 0}
    skipped = []
    failed = []
    try:
        workdirs = {}
        for b in all_blocks:
            n = len(b.commands())
            if b.skip is not None:
                counts["skipped"] += n
                skipped.append(f"{b.where()} ({n}): {b.skip}")
                continue
            if b.slow != args.slow:
                counts["other-suite"] += n
                continue
            if b.needs == "torch" and not have_torch:
                counts["skipped"] += n
                skipped.append(f"{b.where()} ({n}): the build has no libtorch (`sluice train`)")
                continue
            if b.path not in workdirs:
                workdirs[b.path] = os.path.join(scratch, re.sub(r"\W", "_", b.path))
                make_workdir(source, build, workdirs[b.path])
            failures, out, dt = run_block(b, workdirs[b.path], env)
            label = "shortened" if b.shorten else "run"
            if b.known_failing is not None:
                counts["known-failing"] += n
                if failures:
                    print(f"known-failing {b.where()} ({n} command(s), {dt:.1f} s): "
                          f"{b.known_failing}")
                else:
                    failed.append(b.where())
                    print(f"FAIL {b.where()}: marked known-failing ({b.known_failing}) but it "
                          "passes: remove the mark")
                continue
            counts[label] += n
            if failures:
                failed.append(b.where())
                print(f"FAIL {b.where()} ({n} command(s), {dt:.1f} s): " + "; ".join(failures))
                print("  block as run:\n" + "\n".join("    " + l for l in
                                                      b.runnable_text().split("\n")))
                tail = out.strip().split("\n")[-30:]
                print("  output (last 30 lines):\n" + "\n".join("    " + l for l in tail))
            else:
                print(f"ok   {b.where()} ({n} command(s), {label}, {dt:.1f} s)")
            sys.stdout.flush()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    for p in problems:
        print(f"FAIL {p}")
    suite = "slow" if args.slow else "default"
    print(f"\ndocs test ({suite} part): {len(all_blocks)} command blocks in {len(files)} files; "
          f"commands run {counts['run']}, shortened {counts['shortened']}, "
          f"skipped {counts['skipped']}, known-failing {counts['known-failing']}, "
          f"left to the {'default' if args.slow else 'slow'} part {counts['other-suite']}; "
          f"{json_checked} quoted example file(s) checked; the flags of {inline_checked} inline "
          "commands checked against --help")
    if skipped and not args.slow:
        print("skipped, with the reasons the docs give:")
        for s in skipped:
            print("  " + s)
    if failed or problems:
        print(f"{len(failed)} block(s) failed, {len(problems)} problem(s) in the docs")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
