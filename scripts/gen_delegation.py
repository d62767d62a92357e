#!/usr/bin/env python3
"""Generate `liger-burn/src/backend/delegate.rs`: the `Liger<B>` backend decorator's delegation.

`Liger<B>` has the same primitives as `B` and forwards every method of every trait a Burn
`Backend` (and `AutodiffBackend`) is made of to `B`, *including* the methods that have a default
body, so that `B`'s own specialised versions are kept. The few methods listed in `OVERRIDES`
below are routed to the hand-written functions of `liger-burn/src/backend/overrides.rs` instead.

The trait definitions are parsed from the burn-backend sources in the cargo registry, so a Burn
upgrade is: bump `BURN_VERSION`, rerun, review the diff (new methods, changed signatures), and
`cargo check`.

Usage (from the workspace root, or anywhere):

    python3 scripts/gen_delegation.py            # writes liger-burn/src/backend/delegate.rs
    python3 scripts/gen_delegation.py --check    # exits 1 if the file is not up to date
    python3 scripts/gen_delegation.py --stdout   # prints instead of writing

Only the standard library is used.
"""

import argparse
import glob
import os
import re
import sys

BURN_VERSION = "0.21.0"

# ---------------------------------------------------------------------------------------------
# Overrides: (trait, method) -> function of `backend/overrides.rs` called instead of `B::method`.
# The function is called as `overrides::<fn>::<B>(<the method's arguments, in order>)`.
# ---------------------------------------------------------------------------------------------

# The reason Liger exists: Burn primitives routed to the fused kernels of `crate::ops::FusedOps`.
# Adding e.g. gelu is one line here plus one function in overrides.rs.
FUSED_OVERRIDES = {
    ("ActivationOps", "softmax"): "softmax",
    ("ActivationOps", "log_softmax"): "log_softmax",
    ("ModuleOps", "layer_norm"): "layer_norm",
    ("ModuleOps", "attention"): "attention",
    ("ActivationOps", "gelu"): "gelu",
    ("ActivationOps", "gelu_backward"): "gelu_backward",
    ("ActivationOps", "sigmoid"): "sigmoid",
    ("ActivationOps", "sigmoid_backward"): "sigmoid_backward",
    ("FloatTensorOps", "float_matmul"): "matmul",
    ("ModuleOps", "linear"): "linear",
    ("ModuleOps", "linear_x_backward"): "linear_x_backward",
    ("ModuleOps", "linear_weight_backward"): "linear_weight_backward",
    ("ModuleOps", "linear_bias_backward"): "linear_bias_backward",
    ("ModuleOps", "embedding"): "embedding",
    ("ModuleOps", "embedding_backward"): "embedding_backward",
}

# Not fusions: methods where `Liger` deliberately differs from `B`.
ADAPTER_OVERRIDES = {
    ("Backend", "name"): "name",
}

OVERRIDES = {**FUSED_OVERRIDES, **ADAPTER_OVERRIDES}

# ---------------------------------------------------------------------------------------------
# The traits, in output order, with the impl header each is emitted under. `B` is the wrapped
# backend everywhere.
# ---------------------------------------------------------------------------------------------

BASE = "impl<B: FusedOps>"
TRAITS = [
    ("BackendTypes", f"{BASE} BackendTypes for Liger<B>"),
    ("Backend", f"{BASE} Backend for Liger<B>"),
    ("FloatTensorOps", f"{BASE} FloatTensorOps<Self> for Liger<B>"),
    ("IntTensorOps", f"{BASE} IntTensorOps<Self> for Liger<B>"),
    ("BoolTensorOps", f"{BASE} BoolTensorOps<Self> for Liger<B>"),
    ("ModuleOps", f"{BASE} ModuleOps<Self> for Liger<B>"),
    ("ActivationOps", f"{BASE} ActivationOps<Self> for Liger<B>"),
    ("QTensorOps", f"{BASE} QTensorOps<Self> for Liger<B>"),
    ("TransactionOps", f"{BASE} TransactionOps<Self> for Liger<B>"),
    (
        "AutodiffBackend",
        "impl<B: FusedOps + AutodiffBackend> AutodiffBackend for Liger<B>\nwhere\n    B::InnerBackend: FusedOps,",
    ),
]

# Associated types are `type X = B::X;` unless listed here.
ASSOC_TYPES = {
    ("AutodiffBackend", "InnerBackend"): "Liger<B::InnerBackend>",
}

# Imports of the generated file. The signatures are copied from burn-backend, where they use
# `crate::` names: these are found through the globs (burn re-exports burn-backend's public
# items under `burn::tensor`), with the backend aliases imported explicitly because a glob
# also brings a `Device` trait. `core::`/`alloc::`/`std::` names the signatures use are
# imported as the burn-backend source file imports them (see `std_imports`).
HEADER_USES = """\
use super::convert::{Lift, Lower};
use super::{overrides, Liger};
use crate::ops::FusedOps;
#[allow(unused_imports)]
use burn::tensor::{backend::*, ops::*, quantization::*, *};
#[allow(unused_imports)]
use burn::tensor::ops::{
    BoolElem, BoolTensor, Device, FloatElem, FloatTensor, IntElem, IntTensor, QuantizedTensor,
};
"""

# Backend-generic type aliases: `FloatTensor<Self>` *is* `FloatTensor<B>` for `Liger<B>`.
# Any other type generic over the backend (`TensorPrimitive<B>`, `MaxPool2dWithIndices<B>`,
# `TransactionPrimitive<B>`, ...) is a distinct type for `Liger<B>` and `B`: such arguments are
# passed as `arg.lower()` and such results returned as `result.lift()` (zero-cost field moves,
# hand-written in backend/convert.rs). The script fails if one appears nested (`Vec<X<B>>`).
PRIMITIVE_ALIASES = {
    "FloatTensor", "IntTensor", "BoolTensor", "QuantizedTensor",
    "Device", "FloatElem", "IntElem", "BoolElem",
}

# ---------------------------------------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "liger-burn", "src", "backend", "delegate.rs")


class GenError(Exception):
    pass


def find_burn_backend():
    pattern = os.path.expanduser(f"~/.cargo/registry/src/*/burn-backend-{BURN_VERSION}")
    cargo_home = os.environ.get("CARGO_HOME")
    if cargo_home:
        pattern = os.path.join(cargo_home, "registry", "src", "*", f"burn-backend-{BURN_VERSION}")
    hits = sorted(glob.glob(pattern))
    if not hits:
        raise GenError(f"burn-backend {BURN_VERSION} not found at {pattern} (run `cargo fetch`)")
    return hits[0]


# --- lexing helpers --------------------------------------------------------------------------

CHAR_RE = re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")


def mask(src):
    """Blank out comments, string and char literals (same length), so that brackets and
    keywords can be found with plain scanning. Lifetimes are kept."""
    out = list(src)
    n = len(src)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    i = 0
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while depth and j < n:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c in "rb" and re.match(r'b?r#*"', src[i : i + 12]) and not _ident_char(src, i - 1):
            m = re.match(r'b?r(#*)"', src[i:])
            end = src.find('"' + m.group(1), i + len(m.group(0)))
            j = end + 1 + len(m.group(1))
            blank(i, j)
            i = j
        elif c == '"':
            j = i + 1
            while src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            m = CHAR_RE.match(src, i)
            if m:
                blank(i, m.end())
                i = m.end()
            else:
                i += 1  # a lifetime
        else:
            i += 1
    return "".join(out)


def _ident_char(s, i):
    return 0 <= i < len(s) and (s[i].isalnum() or s[i] == "_")


OPEN = {"(": ")", "[": "]", "{": "}", "<": ">"}


def match_close(s, i):
    """Index of the bracket closing the one at `s[i]`; `->` and `=>` are not brackets."""
    stack = []
    j = i
    while j < len(s):
        c = s[j]
        if c in OPEN and not (c == "<" and s[j - 1 : j + 1] == "<<"):
            stack.append(OPEN[c])
        elif c in ")]}>" and not (c == ">" and s[j - 1] in "-="):
            if not stack or stack[-1] != c:
                raise GenError(f"unbalanced {c!r} in: {s[i:j + 1]!r}")
            stack.pop()
            if not stack:
                return j
        j += 1
    raise GenError(f"unclosed bracket in: {s[i:i + 80]!r}")


def split_top(s, sep=","):
    """Split on `sep` outside any brackets."""
    parts, depth, cur = [], 0, []
    for k, c in enumerate(s):
        if c in "([{<" :
            depth += 1
        elif c in ")]}" or (c == ">" and s[k - 1] not in "-="):
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def norm(s):
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"([(<\[]) ", r"\1", s)
    s = re.sub(r" ([)\]])", r"\1", s)
    s = re.sub(r",\s*([)\]>])", r"\1", s)
    s = re.sub(r"(?<![-=]) >", ">", s)
    s = re.sub(r"& ", "&", s)
    return s.rstrip(",").strip()


# --- trait parsing ---------------------------------------------------------------------------


class Method:
    def __init__(self, trait, name, generics, params, ret, where, has_default, cfgs):
        self.trait, self.name = trait, name
        self.generics, self.params, self.ret, self.where = generics, params, ret, where
        self.has_default, self.cfgs = has_default, cfgs


class Trait:
    def __init__(self, name, path, param, supertraits, assoc_types, methods, uses):
        self.name, self.path, self.param, self.uses = name, path, param, uses
        self.supertraits, self.assoc_types, self.methods = supertraits, assoc_types, methods


def parse_traits(root, wanted):
    traits = {}
    for path in sorted(glob.glob(os.path.join(root, "src", "**", "*.rs"), recursive=True)):
        orig = open(path, encoding="utf-8").read()
        src = mask(orig)
        for m in re.finditer(r"\bpub\s+trait\s+(\w+)", src):
            name = m.group(1)
            if name not in wanted:
                continue
            i = m.end()
            param = None
            if src[i:].lstrip().startswith("<"):
                lt = src.index("<", i)
                gt = match_close(src, lt)
                params = split_top(src[lt + 1 : gt])
                if len(params) != 1:
                    raise GenError(f"{name}: expected one generic parameter, got {params}")
                param = params[0].split(":")[0].strip()
                i = gt + 1
            body_open = src.index("{", i)
            header = src[i:body_open]
            supertraits = []
            if header.strip().startswith(":"):
                supertraits = [norm(x) for x in split_top(header.strip()[1:].split(" where ")[0], "+")]
            body_close = match_close(src, body_open)
            body = src[body_open + 1 : body_close]
            rel = os.path.relpath(path, root)
            if name in traits:
                raise GenError(f"trait {name} defined twice ({traits[name].path}, {rel})")
            assoc, methods = parse_body(name, body, orig[body_open + 1 : body_close])
            traits[name] = Trait(name, rel, param, supertraits, assoc, methods, parse_uses(src))
    return traits


def parse_body(trait, body, orig):
    """`body` is masked, `orig` the same text unmasked (for attributes)."""
    assoc, methods = [], []
    i, n = 0, len(body)
    attrs = []
    while i < n:
        if body[i].isspace():
            i += 1
            continue
        if body.startswith("#[", i) or body.startswith("#![", i):
            open_ = body.index("[", i)
            close = match_close(body, open_)
            attrs.append(norm(orig[open_ + 1 : close]))
            i = close + 1
            continue
        m = re.compile(r"type\s+(\w+)").match(body, i)
        if m:
            end = body.index(";", i)
            assoc.append(m.group(1))
            i, attrs = end + 1, []
            continue
        m = re.compile(r"(?:(async|const|unsafe|extern)\s+)*fn\s+(\w+)").match(body, i)
        if not m:
            raise GenError(f"{trait}: cannot parse trait item at: {body[i:i + 80]!r}")
        if m.group(1):
            raise GenError(f"{trait}::{m.group(2)}: `{m.group(1)} fn` is not supported")
        name = m.group(2)
        j = m.end()
        while body[j].isspace():
            j += 1
        generics = ""
        if body[j] == "<":
            gt = match_close(body, j)
            generics = body[j + 1 : gt]
            j = gt + 1
            while body[j].isspace():
                j += 1
        if body[j] != "(":
            raise GenError(f"{trait}::{name}: expected `(`")
        close = match_close(body, j)
        params = body[j + 1 : close]
        j = close + 1
        # return type and where clause, up to `;` or `{` outside brackets
        k = j
        while body[k] not in ";{":
            if body[k] in "(<[" and not (body[k] == "<" and body[k - 1] == "<"):
                k = match_close(body, k)
            k += 1
        rest = body[j:k]
        has_default = body[k] == "{"
        where = ""
        wm = re.search(r"\bwhere\b", rest)
        if wm:
            where, rest = rest[wm.end():], rest[: wm.start()]
        ret = ""
        rest = rest.strip()
        if rest:
            if not rest.startswith("->"):
                raise GenError(f"{trait}::{name}: unexpected {rest!r}")
            ret = rest[2:]
        cfgs = [a for a in attrs if a.startswith("cfg")]
        methods.append(
            Method(trait, name, norm(generics), parse_params(trait, name, params), norm(ret),
                   norm(where), has_default, cfgs)
        )
        i = match_close(body, k) + 1 if has_default else k + 1
        attrs = []
    return assoc, methods


def parse_params(trait, method, s):
    out = []
    for k, p in enumerate(split_top(s)):
        if re.fullmatch(r"&?\s*(mut\s+)?self", p) or p.startswith("self:"):
            raise GenError(f"{trait}::{method}: methods with a receiver are not supported")
        pat, ty = p.split(":", 1)
        pat = re.sub(r"^(ref\s+)?(mut\s+)?", "", pat.strip())
        if not re.fullmatch(r"\w+", pat) or pat == "_":
            pat = f"arg{k}"
        out.append([pat, norm(ty)])
    names = [p for p, _ in out]
    # `_device` is only `_`-prefixed because the default body ignores it; we use it.
    for q in out:
        stripped = q[0].lstrip("_")
        if q[0].startswith("_") and stripped and stripped not in names:
            q[0] = stripped
    return out


def parse_uses(masked_src):
    """Top-level `use` items of a file as (path, imported name) pairs, `{..}` trees expanded.
    Renames (`a::B as C`) give the path `a::B as C` and the name `C`."""
    out = []
    for m in re.finditer(r"^(?:pub(?:\([\w:]+\))?\s+)?use\s+([^;]+);", masked_src, re.M):
        tree = re.sub(r"\s*(::|[{},])\s*", r"\1", re.sub(r"\s+", " ", m.group(1).strip()))
        out.extend(_expand_use("", tree))
    return out


def _expand_use(prefix, tree):
    if tree.endswith("}"):
        head, inner = tree[: tree.index("{")], tree[tree.index("{") + 1 : -1]
        return [x for part in split_top(inner) for x in _expand_use(prefix + head, part)]
    path = prefix + tree
    name = path.split(" as ")[-1].rsplit("::", 1)[-1]
    if "::" not in path or name in ("self", "*", "_"):
        return []
    return [(path, name)]


# In the Rust 2024 prelude: never imported.
PRELUDE = {"String", "Vec", "Box", "Option", "Result", "Future", "IntoFuture", "ToString", "ToOwned"}


def std_imports(uses, text):
    """`use` lines for the core/alloc/std names (e.g. `Range`) that the generated `text` uses."""
    lines = set()
    words = set(re.findall(r"\b\w+\b", text))
    for path, name in uses:
        root = path.split("::")[0]
        if root in ("core", "alloc", "std") and name in words and name not in PRELUDE:
            lines.add(f"use {re.sub(r'^alloc::', 'std::', path)};")
    return sorted(lines)


# --- emission --------------------------------------------------------------------------------


def subst_param(text, param):
    """The trait's backend parameter *is* `Liger<B>`, i.e. `Self` in our impls. Also turns
    burn-backend's `crate::a::b::Name` paths into `Name` (found through the globs) and
    `alloc::` into `std::`."""
    text = re.sub(r"(?<![\w:])crate::(?:\w+::)*(\w+)", r"\1", text)
    text = re.sub(r"(?<![\w:])alloc::", "std::", text)
    if param is None:
        return text
    text = re.sub(rf"(?<![\w:]){param}::(\w+)", r"<Self as BackendTypes>::\1", text)
    return re.sub(rf"(?<![\w:]){param}\b", "Self", text)


def generic_args(generics):
    """Type and const parameter names of a method's generics (no lifetimes)."""
    names = []
    for g in split_top(generics):
        g = g.strip()
        if g.startswith("'"):
            continue
        g = re.sub(r"^const\s+", "", g)
        names.append(re.match(r"\w+", g).group(0))
    return names


def backend_generic(trait, m, ty):
    """For a (substituted) type: None if it is the same for `Liger<B>` and `B`, the struct name
    if it is `Struct<Self>` (convertible with lift/lower), and an error if it nests one."""
    top = re.fullmatch(r"(\w+)<Self>", ty)
    if top and top.group(1) not in PRIMITIVE_ALIASES:
        return top.group(1)
    for gm in re.finditer(r"(\w+)<", ty):
        lt = gm.end() - 1
        args = split_top(ty[lt + 1 : match_close(ty, lt)])
        if gm.group(1) not in PRIMITIVE_ALIASES and "Self" in args:
            raise GenError(
                f"{trait.name}::{m.name}: `{ty}` nests a type generic over the backend: "
                "add the method to ADAPTER_OVERRIDES and convert it by hand in backend/overrides.rs"
            )
    return None


def emit_method(trait, m, qualify):
    params = [(p, subst_param(t, trait.param)) for p, t in m.params]
    ret = subst_param(m.ret, trait.param)
    sig = f"fn {m.name}"
    if m.generics:
        sig += f"<{subst_param(m.generics, trait.param)}>"
    sig += f"({', '.join(f'{p}: {t}' for p, t in params)})"
    if ret:
        sig += f" -> {ret}"
    if m.where:
        sig += f" where {subst_param(m.where, trait.param)}"
    key = (trait.name, m.name)
    if key in OVERRIDES:
        args = ", ".join(p for p, _ in params)
        body = f"overrides::{OVERRIDES[key]}::<B>({args})"
        tag = "  // fused override" if key in FUSED_OVERRIDES else "  // adapter override"
    else:
        args = ", ".join(f"{p}.lower()" if backend_generic(trait, m, t) else p for p, t in params)
        targs = generic_args(m.generics)
        turbofish = f"::<{', '.join(targs)}>" if targs else ""
        target = "B"
        if qualify:
            target = f"<B as {trait.name}<B>>" if trait.param else f"<B as {trait.name}>"
        body = f"{target}::{m.name}{turbofish}({args})"
        if backend_generic(trait, m, ret):
            body += ".lift()"
        tag = ""
    return f"    {sig} {{ {body} }}{tag}"


def generate(root):
    wanted = [t for t, _ in TRAITS]
    traits = parse_traits(root, wanted)
    for t in wanted:
        if t not in traits:
            raise GenError(f"trait {t} not found in burn-backend {BURN_VERSION}")

    # Everything `Backend` requires must be implemented here.
    for sup in traits["Backend"].supertraits:
        if sup.startswith("'"):
            continue
        base = re.match(r"[\w:]+", sup).group(0).split("::")[-1]
        if (base.endswith("Ops") or base == "BackendTypes") and base not in wanted:
            raise GenError(f"Backend requires {sup}, which TRAITS does not cover")

    for (t, meth) in OVERRIDES:
        if t not in traits or meth not in [m.name for m in traits[t].methods]:
            raise GenError(f"override {t}::{meth} does not exist in burn-backend {BURN_VERSION}")

    # Method names present in several traits must be called with a qualified path.
    seen = {}
    for t in wanted:
        for m in traits[t].methods:
            seen.setdefault(m.name, set()).add(t)

    head = [
        f"// @generated by `python3 scripts/gen_delegation.py` from burn-backend {BURN_VERSION}.",
        "// Do not edit by hand: edit the script (overrides, trait list) or backend/overrides.rs,",
        "// then rerun it. To upgrade Burn, bump BURN_VERSION in the script, rerun, review the diff.",
        "//",
        "// Every method of every trait `Backend` / `AutodiffBackend` is made of is forwarded to `B`,",
        "// default-bodied ones included (so `B`'s specialisations are kept); the methods marked",
        "// `// fused override` / `// adapter override` call `backend/overrides.rs` instead.",
        "",
        HEADER_USES.rstrip(),
    ]
    lines = []
    skipped = []
    for tname, header in TRAITS:
        trait = traits[tname]
        n_fwd = sum(1 for m in trait.methods if not m.cfgs)
        lines.append(f"// {tname}: {trait.path}, {n_fwd} method{'' if n_fwd == 1 else 's'}.")
        lines.append(f"{header}\n{{" if "\n" in header else f"{header} {{")
        for a in trait.assoc_types:
            lines.append(f"    type {a} = {ASSOC_TYPES.get((tname, a), f'B::{a}')};")
        if trait.assoc_types and trait.methods:
            lines.append("")
        for m in trait.methods:
            if m.cfgs:
                # Gated on a feature of burn-backend itself, which this crate cannot test for.
                if not m.has_default:
                    raise GenError(f"{tname}::{m.name} is required and gated on {m.cfgs}")
                skipped.append(f"{tname}::{m.name} (#[{', '.join(m.cfgs)}])")
                continue
            lines.append(emit_method(trait, m, qualify=len(seen[m.name]) > 1))
        lines.append("}")
        lines.append("")
    if skipped:
        lines.append("// Not forwarded (their default body is used): methods gated on a feature of")
        lines.append("// burn-backend itself, which this crate cannot `cfg` on:")
        for s in skipped:
            lines.append(f"// - {s}")
    body = "\n".join(lines)
    uses = [u for t in wanted for u in traits[t].uses]
    head += std_imports(uses, body) + [""]
    return "\n".join(head + lines).rstrip() + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if delegate.rs is out of date")
    ap.add_argument("--stdout", action="store_true", help="print instead of writing")
    args = ap.parse_args()
    try:
        text = generate(find_burn_backend())
    except GenError as e:
        print(f"gen_delegation: error: {e}", file=sys.stderr)
        return 2
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        cur = open(OUT, encoding="utf-8").read() if os.path.exists(OUT) else ""
        if cur != text:
            print(f"{os.path.relpath(OUT, ROOT)} is out of date: rerun scripts/gen_delegation.py",
                  file=sys.stderr)
            return 1
        return 0
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(OUT, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
