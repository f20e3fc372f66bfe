#!/usr/bin/env python3
"""The workspace's structure, drawn from its own sources: long functions and import circles.

Usage: python3 tools/structure.py [--max-fn-lines N] [--through-reexports] [--root DIR]

For every crate of the Cargo workspace (the root's `[workspace] members`, and the root
package itself when it has one), this reads the Rust files under the crate's `src/` and
prints two reports:

(a) Long functions. Every function whose body spans more than N lines (default 70),
    with file:line, name and length, then a count per crate and in all.
(b) Import circles. The crate's file-level import graph, and each strongly connected
    component of more than one file in it (Tarjan's algorithm), with the imports that
    tie it together.

It is a report, not a gate: it always exits 0. It uses python3's standard library only.

Heuristics (it reads text, it does not compile):

- Lexing. Comments (line, block, nested block, doc), string literals (plain, byte, raw
  `r#"..."#`) and char literals are blanked before anything is matched; newlines are
  kept, so line numbers stay true. A `'` starts a char literal when it is followed by an
  escape or by one character and a closing `'`; otherwise it is a lifetime.
- Functions. A function is `fn NAME` followed, at parenthesis and bracket depth 0, by
  `{` (a body) before any `;` (a declaration without a body, skipped). Its length counts
  lines from the `fn` line to the line of the matching `}`, both included (attributes
  and doc comments above it are not counted). A nested function is reported on its own
  and its lines also count towards the function around it.
- Tests are left out: the item after any `#[cfg(...)]` attribute that names `test` (not
  as `not(test)`), and every `#[test]` function. An excluded `mod NAME;` excludes the
  file it names and everything under it. `tests/` folders and benches are outside
  `src/`, so they are never read; `#[cfg(feature = "testkit")]` code is library code and
  is read.
- Modules. A file's module path follows from where it lies: `src/lib.rs` and
  `src/main.rs` are the crate root, `src/a.rs` and `src/a/mod.rs` are `a`, `src/a/b.rs`
  is `a::b`; `src/bin/` files and `#[path]` attributes are ignored (the workspace uses
  neither in `src/`). Inline `mod NAME { ... }` blocks are modules within their file, so
  `super` and `self` inside them resolve as the compiler would; every path that lands
  in an inline module lands in its file.
- Imports. File A imports file B when A mentions a path that resolves to a module held
  in B: in a `use` tree (braces expanded) or as a qualified path in code. A path
  resolves when it starts with `crate::`, `super::` or `self::`, with the name of a
  child module of the current module (a module-relative path such as `frame::Frame`
  below `mod frame;`), or with a name a `use` brought into scope (`use crate::http;`
  then `http::AppState`). It then walks down the module tree for as long as its
  segments name modules, and the file of the last module reached is the target:
  `crate::disk::block::Block` is `disk/block.rs`, `crate::store::Batch` is `store.rs`,
  and `crate::Event`, an item the crate root re-exports, is `lib.rs`. That is the
  import as written, the default. With `--through-reexports` a name that a module
  imports by `use` (a re-export such as the root's `pub use replica::Delta`) is followed
  to the file that defines it, so `crate::Event` lands in `event.rs`: this finds the
  circles the crate root's re-exports hide.
- Not imports: a `mod b;` declaration (the parent-child relation of the tree); a
  `pub use` or `pub(crate) use` re-export (a facade, not a use by the file's own code:
  counting them would put every crate root in a circle with every file that names a
  re-exported item); `$crate::` paths in macros; paths into other crates; a file's
  paths into itself; imports inside test code (as above).
- Crates. Every member with a `src/` folder, except those under `tests/` (the netns
  fault harness is a test, like other `tests/` folders). A crate with both `src/lib.rs` and `src/main.rs` is read as one tree; in this
  workspace every `main.rs` reaches its library through the library's crate name, so
  it adds no edge.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
IDENT_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


# ---------------------------------------------------------------- lexing


def blank(text: str) -> str:
    """The text with comments, strings and char literals replaced by spaces, newlines kept."""
    out = list(text)
    n = len(text)
    i = 0

    def wipe(start: int, end: int) -> None:
        for k in range(start, min(end, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            end = text.find("\n", i)
            end = n if end < 0 else end
            wipe(i, end)
            i = end
        elif c == "/" and nxt == "*":
            depth, k = 1, i + 2
            while k < n and depth:
                if text.startswith("/*", k):
                    depth, k = depth + 1, k + 2
                elif text.startswith("*/", k):
                    depth, k = depth - 1, k + 2
                else:
                    k += 1
            wipe(i, k)
            i = k
        elif c in "rb" and (i == 0 or text[i - 1] not in IDENT_CHARS):
            m = re.compile(r'(?:br|r)(#*)"').match(text, i)
            if m:
                close = '"' + m.group(1)
                end = text.find(close, m.end())
                end = n if end < 0 else end + len(close)
                wipe(i, end)
                i = end
            elif c == "b" and nxt == '"':
                i = skip_string(text, i + 1, wipe)
            elif c == "b" and nxt == "'":
                i = skip_char(text, i + 1, wipe) or i + 2
            else:
                i += 1
        elif c == '"':
            i = skip_string(text, i, wipe)
        elif c == "'":
            end = skip_char(text, i, wipe)
            i = end if end else i + 1
        else:
            i += 1
    return "".join(out)


def skip_string(text: str, i: int, wipe) -> int:
    """Blank the string literal whose opening quote is at `i`; the index after it."""
    k = i + 1
    while k < len(text) and text[k] != '"':
        k += 2 if text[k] == "\\" else 1
    wipe(i, k + 1)
    return k + 1


def skip_char(text: str, i: int, wipe) -> int | None:
    """Blank the char literal at `i` and return the index after it, or None for a lifetime."""
    if text.startswith("\\", i + 1):
        end = text.find("'", i + 3)
        if end < 0:
            return None
        wipe(i, end + 1)
        return end + 1
    if i + 2 < len(text) and text[i + 2] == "'" and text[i + 1] != "\n":
        wipe(i, i + 3)
        return i + 3
    return None


def matching_brace(code: str, open_at: int, pair: str = "{}") -> int:
    """The index of the bracket closing the one at `open_at` (or the text's last index)."""
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] == pair[0]:
            depth += 1
        elif code[k] == pair[1]:
            depth -= 1
            if depth == 0:
                return k
    return len(code) - 1


def item_body(code: str, start: int) -> tuple[str, int, int] | None:
    """From `start`, the first `{` or `;` at paren/bracket depth 0: ('{', open, close) or (';', at, at)."""
    depth = 0
    for k in range(start, len(code)):
        ch = code[k]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth <= 0 and ch == ";":
            return (";", k, k)
        elif ch == "{":
            return ("{", k, matching_brace(code, k))
    return None


class Lines:
    """Index to 1-based line number."""

    def __init__(self, text: str) -> None:
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def of(self, index: int) -> int:
        lo, hi = 0, len(self.starts)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.starts[mid] <= index:
                lo = mid
            else:
                hi = mid
        return lo + 1


# ---------------------------------------------------------------- one file

ATTR = re.compile(r"#\s*\[")
TEST_CFG = re.compile(r"\btest\b")
NOT_TEST = re.compile(r"\bnot\s*\(\s*test\s*\)")


@dataclass
class Source:
    """One file: its blanked code, line index, test ranges and inline modules."""

    rel: str
    module: tuple[str, ...]
    code: str
    lines: Lines
    test_ranges: list[tuple[int, int]] = field(default_factory=list)
    excluded_children: set[str] = field(default_factory=set)
    inline_mods: list[tuple[int, int, str]] = field(default_factory=list)
    child_mods: set[str] = field(default_factory=set)

    def in_tests(self, index: int) -> bool:
        return any(a <= index <= b for a, b in self.test_ranges)

    def module_at(self, index: int) -> tuple[str, ...]:
        """The module path at `index`, inline modules included."""
        inner = sorted(
            (a, name) for a, b, name in self.inline_mods if a <= index <= b
        )
        return self.module + tuple(name for _, name in inner)


def read_source(path: str, rel: str, module: tuple[str, ...]) -> Source:
    with open(path, encoding="utf-8") as f:
        code = blank(f.read())
    src = Source(rel=rel, module=module, code=code, lines=Lines(code))
    for m in ATTR.finditer(code):
        open_at = code.index("[", m.start())
        end = matching_brace(code, open_at, "[]") + 1
        attr = code[open_at + 1 : end - 1].strip()
        is_test = attr == "test" or (
            attr.startswith("cfg") and not attr.startswith("cfg_attr")
            and TEST_CFG.search(attr) and not NOT_TEST.search(attr)
        )
        if not is_test or (m.start() > 0 and code[m.start() + 1] == "!"):
            continue
        body = item_body(code, end)
        if body is None:
            continue
        kind, a, b = body
        src.test_ranges.append((m.start(), b))
        if kind == ";":
            mod = re.search(r"\bmod\s+(" + IDENT + r")\s*$", code[end:a])
            if mod:
                src.excluded_children.add(mod.group(1))
    for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*([{;])", code):
        if m.group(2) == "{":
            open_at = m.end() - 1
            src.inline_mods.append((open_at, matching_brace(code, open_at), m.group(1)))
        elif not src.in_tests(m.start()):
            src.child_mods.add(m.group(1))
    return src


def functions(src: Source):
    """(line, name, length) of every function with a body outside tests."""
    for m in re.finditer(r"\bfn\s+(" + IDENT + r")", src.code):
        if src.in_tests(m.start()):
            continue
        body = item_body(src.code, m.end())
        if body is None or body[0] != "{":
            continue
        first, last = src.lines.of(m.start()), src.lines.of(body[2])
        yield first, m.group(1), last - first + 1


# ---------------------------------------------------------------- paths


def use_paths(tokens: list[str]) -> list[tuple[list[str], str | None]]:
    """Expand a `use` tree's tokens into its paths: (segments, the name it binds or None for a glob)."""
    paths: list[tuple[list[str], str | None]] = []

    def tree(i: int, prefix: list[str]) -> int:
        path, bound = list(prefix), None
        while i < len(tokens):
            t = tokens[i]
            if t == "{":
                i += 1
                while i < len(tokens) and tokens[i] != "}":
                    if tokens[i] == ",":
                        i += 1
                        continue
                    i = tree(i, path)
                return i + 1
            if t in (",", "}"):
                break
            if t == "::":
                i += 1
                continue
            if t == "as":
                bound = tokens[i + 1] if i + 1 < len(tokens) else None
                i += 2
                continue
            if t == "*":
                bound = "*"
            else:
                path.append(t)
            i += 1
        if bound is None and path:
            bound = path[-1] if path[-1] != "self" else (path[-2] if len(path) > 1 else None)
        paths.append((path, None if bound == "*" else bound))
        return i

    tree(0, [])
    return [(p, b) for p, b in paths if p]


USE = re.compile(r"\buse\b(?!\s*<)([^;]*);")
# `pub use` and `pub(crate) use` just before a `use`: a re-export.
REEXPORT = re.compile(r"\bpub\s*(?:\([^)]*\))?\s*\Z")
TOKEN = re.compile(IDENT + r"|::|[{},*]")
QUALIFIED = re.compile(r"(?<![A-Za-z0-9_$:])(" + IDENT + r")((?:\s*::\s*" + IDENT + r")+)")


@dataclass
class Crate:
    """One crate: its files by module path, its module tree and the names each module imports."""

    name: str
    sources: dict[str, Source]
    module_file: dict[tuple[str, ...], str]
    children: dict[tuple[str, ...], set[str]]
    # module -> name it binds by `use` -> (the module the `use` is written in, its path)
    names: dict[tuple[str, ...], dict[str, tuple[tuple[str, ...], list[str]]]]
    # False for --as-written: a re-exported name lands in the file that re-exports it.
    follow_reexports: bool = False

    def resolve(self, here: tuple[str, ...], segments: list[str], depth: int = 0) -> str | None:
        """The file a path written in module `here` lands in, or None if it leaves the crate.

        A name a module imports by `use` (a re-export, or a private import seen from a
        child) is followed to where it comes from.
        """
        if not segments or depth > 16:
            return None
        head = segments[0]
        if head == "crate":
            module, rest = (), segments[1:]
        elif head in ("self", "super"):
            module, rest = here, segments
            while rest and rest[0] in ("self", "super"):
                if rest[0] == "super":
                    if not module:
                        return None
                    module = module[:-1]
                rest = rest[1:]
        elif head in self.children.get(here, ()):
            module, rest = here, segments
        elif head in self.names.get(here, {}):
            context, path = self.names[here][head]
            return self.resolve(context, path + segments[1:], depth + 1)
        else:
            return None
        for i, seg in enumerate(rest):
            if seg in self.children.get(module, ()):
                module = module + (seg,)
            elif self.follow_reexports and seg in self.names.get(module, {}):
                context, path = self.names[module][seg]
                if path[-1:] == [seg] and context == module and path[:1] == ["self"] and len(path) == 2:
                    break
                target = self.resolve(context, path + rest[i + 1 :], depth + 1)
                return target or self.module_file.get(module)
            else:
                break
        return self.module_file.get(module)


def load_crate(name: str, crate_dir: str, root: str) -> Crate | None:
    src_dir = os.path.join(crate_dir, "src")
    if not os.path.isdir(src_dir):
        return None
    sources: dict[str, Source] = {}
    for dirpath, dirnames, filenames in os.walk(src_dir):
        dirnames.sort()
        if os.path.relpath(dirpath, src_dir).split(os.sep)[0] == "bin":
            continue
        for fname in sorted(filenames):
            if not fname.endswith(".rs"):
                continue
            path = os.path.join(dirpath, fname)
            parts = os.path.relpath(path, src_dir)[:-3].split(os.sep)
            if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
                parts = parts[:-1]
            rel = os.path.relpath(path, root)
            sources[rel] = read_source(path, rel, tuple(parts))
    # Files reached only through a test-gated `mod` are tests.
    excluded = set()
    for src in sources.values():
        for child in src.excluded_children:
            excluded.add(src.module + (child,))
    for rel in list(sources):
        module = sources[rel].module
        if any(module[: len(e)] == e for e in excluded):
            del sources[rel]
    module_file: dict[tuple[str, ...], str] = {}
    children: dict[tuple[str, ...], set[str]] = defaultdict(set)
    names: dict = defaultdict(dict)
    # lib.rs before main.rs: the crate root's file is the library's.
    for rel, src in sorted(sources.items(), key=lambda kv: kv[0].endswith("main.rs")):
        module_file.setdefault(src.module, rel)
        if src.module:
            children[src.module[:-1]].add(src.module[-1])
        for a, b, mod_name in src.inline_mods:
            if src.in_tests(a):
                continue
            inner = src.module_at(a) + (mod_name,)
            module_file[inner] = rel
            children[inner[:-1]].add(mod_name)
        for m in USE.finditer(src.code):
            if src.in_tests(m.start()):
                continue
            here = src.module_at(m.start())
            for path, bound in use_paths(TOKEN.findall(m.group(1))):
                if bound and bound != "_":
                    names[here].setdefault(bound, (here, path))
    return Crate(name, sources, module_file, children, names)


def imports(crate: Crate) -> dict[str, dict[str, list[str]]]:
    """source file -> target file -> the paths (as written, with line) that tie them."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))

    def add(src: Source, index: int, segments: list[str]) -> None:
        target = crate.resolve(src.module_at(index), segments)
        if target and target != src.rel:
            edges[src.rel][target].append(f"{src.rel}:{src.lines.of(index)} {'::'.join(segments)}")

    for src in crate.sources.values():
        code = src.code
        use_spans = []
        for m in USE.finditer(code):
            use_spans.append((m.start(), m.end()))
            if src.in_tests(m.start()) or REEXPORT.search(code, max(0, m.start() - 40), m.start()):
                continue
            for path, _ in use_paths(TOKEN.findall(m.group(1))):
                add(src, m.start(), path)
        for m in QUALIFIED.finditer(code):
            if src.in_tests(m.start()) or any(a <= m.start() < b for a, b in use_spans):
                continue
            segments = [m.group(1)] + re.findall(IDENT, m.group(2))
            add(src, m.start(), segments)
    return edges


def strongly_connected(nodes: list[str], edges: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Tarjan's strongly connected components."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return components


# ---------------------------------------------------------------- workspace


def workspace_crates(root: str) -> list[tuple[str, str]]:
    """(package name, directory) of every member, the root package included."""
    with open(os.path.join(root, "Cargo.toml"), "rb") as f:
        manifest = tomllib.load(f)
    dirs = list(manifest.get("workspace", {}).get("members", []))
    if "package" in manifest:
        dirs.insert(0, ".")
    crates = []
    for d in dirs:
        path = os.path.normpath(os.path.join(root, d))
        try:
            with open(os.path.join(path, "Cargo.toml"), "rb") as f:
                name = tomllib.load(f).get("package", {}).get("name", d)
        except OSError:
            continue
        crates.append((name, path))
    return crates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-fn-lines", type=int, default=70, metavar="N",
                        help="report functions longer than N lines (default 70)")
    parser.add_argument("--through-reexports", action="store_true",
                        help="follow a re-exported name to the file that defines it")
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                        help="the workspace root (default: this script's parent folder)")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    members = [(n, d) for n, d in workspace_crates(root)
               if not os.path.relpath(d, root).split(os.sep)[0] == "tests"]
    crates = [c for c in (load_crate(n, d, root) for n, d in members) if c]
    for crate in crates:
        crate.follow_reexports = args.through_reexports

    print(f"# Functions over {args.max_fn_lines} lines outside tests (src/ of each crate)")
    total = 0
    counts = []
    for crate in crates:
        long = []
        for rel, src in sorted(crate.sources.items()):
            for line, name, length in functions(src):
                if length > args.max_fn_lines:
                    long.append((rel, line, name, length))
        for rel, line, name, length in long:
            print(f"{rel}:{line} {name} {length}")
        counts.append((crate.name, len(long)))
        total += len(long)
    print()
    for name, count in counts:
        print(f"{name}: {count}")
    print(f"total: {total}")

    print()
    how = "re-exports followed to their file" if args.through_reexports else "imports as written"
    print(f"# Import circles, {how} (strongly connected components of more than one file)")
    in_circles_total = 0
    summary = []
    for crate in crates:
        edges = imports(crate)
        components = [c for c in strongly_connected(list(crate.sources), edges) if len(c) > 1]
        files = sum(len(c) for c in components)
        in_circles_total += files
        summary.append((crate.name, len(components), files))
        for component in components:
            print(f"{crate.name}: {len(component)} files: {', '.join(component)}")
            members = set(component)
            for a in component:
                for b in sorted(edges.get(a, {})):
                    if b in members:
                        via = edges[a][b]
                        more = f" (+{len(via) - 1} more)" if len(via) > 1 else ""
                        print(f"    {a} -> {b}: {via[0].split(' ', 1)[1]} at line {via[0].split(' ')[0].rsplit(':', 1)[1]}{more}")
    print()
    for name, n_components, files in summary:
        print(f"{name}: {n_components} circles, {files} files in circles")
    print(f"total: {in_circles_total} files in circles")
    return 0


if __name__ == "__main__":
    try:
        main()
    except SystemExit:  # argparse's --help or a bad flag: still a report
        pass
    except Exception as error:  # a report, not a gate
        print(f"structure.py: {error}", file=sys.stderr)
    sys.exit(0)
