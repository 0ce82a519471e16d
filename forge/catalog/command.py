"""`forge catalog`: the foundation families and their phase checkpoints and curated sets.

    forge catalog list                               every family, its phases and their points
    forge catalog show FAMILY                        phases (location, revision, architecture, size,
                                                     context, licence, Bedrock) and curated sets, cited
    forge catalog add FAMILY@PHASE PATH [--point P]  register a local checkpoint (yours, or a Novella)
    forge catalog remove FAMILY@PHASE                forget a registration (built-in phases stay)

A recipe starts from a phase with `base: catalog://FAMILY@PHASE` and replays a curated set with
`source: curated://FAMILY/NAME`. Registrations live in FORGE_HOME/catalog.yaml (default .forge/
in the working directory).
"""
from __future__ import annotations

import argparse

from forge.catalog import POINTS, add as add_phase, build_note, families, family, remove as remove_phase
from forge.catalog.entries import CatalogPhase, Family, registrations_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="catalog_command", required=True, metavar="ACTION")
    sub.add_parser("list", help="every family with its phases")
    p = sub.add_parser("show", help="one family: phases, locations, revisions, curated sets")
    p.add_argument("family")
    p = sub.add_parser("add", help="register a local checkpoint folder as FAMILY@PHASE")
    p.add_argument("ref", metavar="FAMILY@PHASE")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--point", choices=POINTS, help="which starting point it is (default: the phase name, "
                   "when that is one of the three)")
    p = sub.add_parser("remove", help="forget a registered phase")
    p.add_argument("ref", metavar="FAMILY@PHASE")


def _size(n: int | None) -> str:
    if not n:
        return "?"
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n:,}"


def _phase_line(ph: CatalogPhase) -> str:
    bedrock = "Bedrock import: yes" if ph.bedrock else "Bedrock import: no"
    return (f"  {ph.phase} [{ph.point}] {ph.location} ({ph.origin}): {ph.architecture or '?'}, {_size(ph.parameters)} "
            f"params, context {ph.context or '?'}, {bedrock}")


def _list() -> int:
    for name, fam in families().items():
        built = "" if fam.built else "  (not built yet)"
        points = ", ".join(f"{p} [{ph.point}]" for p, ph in fam.phases.items())
        print(f"{name}: {points}{built}")
    print(f"registrations: {registrations_file()}")
    return 0


def _show(name: str) -> int:
    fam: Family = family(name, "family")
    print(f"{fam.name}: {fam.description or fam.origin}")
    if fam.licence:
        print(f"licence: {fam.licence}")
    if not fam.built:
        print(build_note(f"catalog://{fam.name}@x") + "; until then its phases are the ones it will write:")
    elif fam.build and fam.corpus:
        print(f"corpus sha256: {fam.corpus.get('sha256')} (its curated sets, checked each time the family is read)")
    elif fam.build:
        print(f"corpus sha256: not recorded (built by an older forge, from other text); remove {fam.home} to "
              "build it again")
    print("phases:")
    for ph in fam.phases.values():
        print(_phase_line(ph))
        extra = [f"tokenizer: {ph.tokenizer}" if ph.tokenizer else "",
                 f"trained on: {', '.join(ph.curated)}" if ph.curated else "",
                 f"cite: {ph.cite}" if ph.cite else "",
                 f"from: Novella {ph.registered_from.get('novella')!r} ({ph.registered_from.get('base')})"
                 if ph.registered_from else ""]
        for line in filter(None, extra):
            print(f"      {line}")
    if fam.curated:
        print("curated sets (source: curated://FAMILY/NAME):")
    for c in fam.curated.values():
        what = "chat " + c.chat.get("kind", "") if c.chat else f"text field {c.text_field!r}"
        stand = ", stand-in (not the family's own data)" if c.stand_in else ""
        print(f"  {c.name} [{c.purpose}] {c.location}: {what}{stand}")
        digest = (fam.corpus or {}).get("sets", {}).get(c.name)
        if digest:
            print(f"      sha256: {digest}")
        for line in filter(None, [f"cite: {c.cite}" if c.cite else "", f"note: {c.note}" if c.note else "",
                                  f"licence: {c.licence}" if c.licence else ""]):
            print(f"      {line}")
    return 0


def run(args: argparse.Namespace) -> int:
    action = args.catalog_command
    if action == "list":
        return _list()
    if action == "show":
        return _show(args.family)
    if action == "add":
        ph = add_phase(args.ref, args.path, args.point)
        print(f"registered {ph.ref} [{ph.point}]: {ph.location} ({ph.architecture}, {_size(ph.parameters)} params, "
              f"context {ph.context}); in {registrations_file()}")
        return 0
    ph = remove_phase(args.ref)
    print(f"removed {ph.ref} ({ph.location}); the folder itself is untouched")
    return 0
