#!/usr/bin/python3
"""docs/cli.md from `sluice --help` and every subcommand's `--help`.

    scripts/cli_doc.py build/sluice > docs/cli.md     # regenerate
    scripts/cli_doc.py build/sluice --check docs/cli.md   # the test (cli_doc_test): exit 1 when
                                                          # docs/cli.md differs from --help

Every flag and positional of every subcommand appears once, in its subcommand's table, with its
value, default and help text as `--help` prints them. A flag added to the CLI without
regenerating this file fails the check, so the reference cannot drift from the program.
"""

import difflib
import re
import subprocess
import sys

NAME_COL = 30  # CLI11 puts descriptions at this column (or on the next line at it)


def help_of(sluice, path):
    out = subprocess.run([sluice] + path + ["--help"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, check=False)
    if out.returncode != 0:
        sys.exit(f"cli_doc: `sluice {' '.join(path)} --help` exited {out.returncode}")
    return out.stdout.decode("utf-8")


def parse(text):
    """(description, usage, sections) of one --help text; sections: name -> [(left, help)]."""
    lines = text.rstrip("\n").split("\n")
    description = lines[0].strip()
    usage = ""
    sections = {}
    current = None
    for line in lines[1:]:
        if line.startswith("Usage:"):
            usage = line[len("Usage:"):].strip()
            usage = re.sub(r"^\S*sluice", "sluice", usage)
            continue
        if not line.strip():
            continue
        if not line.startswith(" ") and line.rstrip().endswith(":"):
            current = line.rstrip()[:-1]
            sections[current] = []
            continue
        if current is None:
            continue
        if line.startswith(" " * NAME_COL) and sections[current]:
            left, helptext = sections[current][-1]
            sections[current][-1] = (left, (helptext + " " + line.strip()).strip())
            continue
        body = line[2:]
        m = re.match(r"(\S.*?)(?:\s{2,}(\S.*))?$", body)
        if (m.group(2) is None and len(line) > NAME_COL and line[NAME_COL - 1] == " "
                and line[NAME_COL] != " "):
            # A name exactly as wide as the column: one space before the description.
            sections[current].append((line[2:NAME_COL].strip(), line[NAME_COL:].strip()))
            continue
        sections[current].append((m.group(1).strip(), (m.group(2) or "").strip()))
    return description, usage, sections


def split_option(left):
    """'--mbs N,...=1' -> ('--mbs', 'N,...', '1'); '-h,--help' -> ('-h,--help', '', '')."""
    m = re.match(r"(\S+)(?:\s+(.*))?$", left)
    names, rest = m.group(1), (m.group(2) or "")
    default = ""
    required = False
    if "=" in names:  # a flag with a default and no value name
        names, default = names.split("=", 1)
    if rest.endswith(" REQUIRED"):
        rest, required = rest[:-len(" REQUIRED")], True
    elif rest == "REQUIRED":
        rest, required = "", True
    notes = ""
    m = re.search(r"\s+((?:Excludes|Needs):.*)$", rest)
    if m:
        rest, notes = rest[:m.start()], m.group(1)
    m = re.match(r"(K=V,\.\.\.(?:\|FILE)?)(?:=(.*))?$", rest)  # a value name holding "="
    if m:
        rest, default = m.group(1), m.group(2) or ""
    elif "=" in rest:
        rest, default = rest.split("=", 1)
    return names, rest.strip(), default.strip(), required, notes


def cell(text):
    return text.replace("|", "\\|")


def subcommands(sections):
    return [left.split()[0] for left, _ in sections.get("Subcommands", [])]


def walk(sluice, path, out):
    description, usage, sections = parse(help_of(sluice, path))
    title = " ".join(["sluice"] + path)
    out.append(f"## `{title}`\n")
    out.append(f"{description}\n")
    out.append(f"Usage: `{usage}`\n")
    rows = []
    for left, helptext in sections.get("Positionals", []):
        names, value, default, required, notes = split_option(left)
        helptext = f"{helptext} ({notes.replace('Excludes:', 'not with')})" if notes else helptext
        rows.append((names, value, default, "required" if required else "", helptext))
    for left, helptext in sections.get("Options", []):
        names, value, default, required, notes = split_option(left)
        if names in ("-h,--help", "--help"):
            continue
        helptext = f"{helptext} ({notes.replace('Excludes:', 'not with')})" if notes else helptext
        rows.append((names, value, default, "required" if required else "", helptext))
    if rows:
        out.append("| flag | value | default | meaning |")
        out.append("|---|---|---|---|")
        for names, value, default, req, helptext in rows:
            flag = " ".join(f"`{n}`" for n in names.split(","))
            shown = "required" if req == "required" else (f"`{default}`" if default else "")
            out.append(f"| {flag} | {cell(value)} | {cell(shown)} | {cell(helptext)} |")
        out.append("")
    else:
        out.append("No flags besides `--help`.\n")
    for sub in subcommands(sections):
        walk(sluice, path + [sub], out)


def generate(sluice):
    description, usage, sections = parse(help_of(sluice, []))
    out = ["# Command-line reference", "",
           "Generated from `sluice --help` and every subcommand's `--help` by",
           "`scripts/cli_doc.py build/sluice > docs/cli.md`; the test `cli_doc_test` fails when",
           "this file differs from what the binary prints, so every flag is documented here once.",
           "Flags shared by several subcommands mean the same everywhere (`README.md`,",
           "\"Commands\"). Exit codes: 0 success, 1 a failed run, 2 bad usage or bad input.",
           "Which subcommands exist depends on the build: `train` and `profile` need libtorch.",
           "", f"## `sluice`", "", f"{description}", "", f"Usage: `{usage}`", ""]
    for left, helptext in sections.get("Options", []):
        names, value, default, _, _ = split_option(left)
        if names in ("-h,--help",):
            continue
        out.append(f"- `{names}`: {helptext}")
    out.append("")
    out.append("| subcommand | what it does |")
    out.append("|---|---|")
    for left, helptext in sections.get("Subcommands", []):
        out.append(f"| `sluice {left.split()[0]}` | {cell(helptext)} |")
    out.append("")
    for sub in subcommands(sections):
        walk(sluice, [sub], out)
    return "\n".join(out).rstrip("\n") + "\n"


def main():
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--check"):
        sys.exit("usage: cli_doc.py SLUICE [--check docs/cli.md]")
    text = generate(sys.argv[1])
    if len(sys.argv) == 2:
        sys.stdout.write(text)
        return 0
    have = open(sys.argv[3], encoding="utf-8").read()
    if not re.search(r"^  train\b", help_of(sys.argv[1], []), re.M):
        # A build without libtorch has no train/profile: every section it prints but the
        # overview (which lists the subcommands) must be in the file as generated.
        missing = [s.split("\n")[0] for s in text.split("\n## ")[2:] if s not in have]
        if missing:
            print(f"cli_doc: {sys.argv[3]} lacks or differs in these sections (build without "
                  f"libtorch): {missing}; regenerate it with a libtorch build")
            return 1
        print(f"cli_doc: {sys.argv[3]} matches --help (build without libtorch: train and "
              "profile not checked)")
        return 0
    if have == text:
        flags = text.count("\n| `-")
        print(f"cli_doc: {sys.argv[3]} matches --help ({flags} flag rows)")
        return 0
    sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), text.splitlines(True),
                                               sys.argv[3], "from --help"))
    print(f"cli_doc: {sys.argv[3]} differs from --help (above); regenerate it: "
          f"scripts/cli_doc.py build/sluice > docs/cli.md")
    return 1


if __name__ == "__main__":
    sys.exit(main())
