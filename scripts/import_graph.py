"""The package's import graph at the scale of packages: which package imports which, their levels,
and any cycle. Reads the source as text (nothing is imported or run).

  python scripts/import_graph.py [--root DIR]     (default: the checkout this script is in)

A unit is a package directly under speculative/ (its subpackages included), a module directly
under speculative/, or scripts/ as a whole. An import of `speculative.X...` anywhere in a unit's
files (module level or inside a function) is an arrow to X's unit. Level 1 units import no other
unit; a unit's level is one more than the highest level it imports. Prints one line a unit, top
level first, then the counts; exits 1 if two units import each other through a cycle.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
import sys


def unit_of(path: Path, root: Path) -> str:
  parts = path.relative_to(root).parts
  if parts[0] == 'scripts':
    return 'scripts/'
  if len(parts) == 2:  # speculative/<module>.py
    return f'speculative/{parts[1]}'
  return f'speculative/{parts[1]}/'


def target_unit(module: str, root: Path) -> str | None:
  parts = module.split('.')
  if parts[0] != 'speculative' or len(parts) == 1:
    return None
  if (root / 'speculative' / parts[1]).is_dir():
    return f'speculative/{parts[1]}/'
  if (root / 'speculative' / f'{parts[1]}.py').is_file():
    return f'speculative/{parts[1]}.py'
  return None  # an old module path, mapped by speculative/__init__.py


def imports(path: Path) -> set[str]:
  tree = ast.parse(path.read_text(encoding='utf-8'))
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      found.add(node.module)
      found.update(f'{node.module}.{alias.name}' for alias in node.names)
  return found


def graph(root: Path) -> dict[str, set[str]]:
  edges: dict[str, set[str]] = {}
  files = list((root / 'speculative').rglob('*.py')) + list((root / 'scripts').glob('*.py'))
  for path in files:
    if path.name == '__init__.py' and path.parent == root / 'speculative':
      continue  # the package map (and the old paths) only
    unit = unit_of(path, root)
    edges.setdefault(unit, set())
    for module in imports(path):
      target = target_unit(module, root)
      if target and target != unit:
        edges[unit].add(target)
  return edges


def levels(edges: dict[str, set[str]]) -> tuple[dict[str, int], list[list[str]]]:
  """Each unit's level, and the cycles (strongly connected groups of more than one unit)."""
  index, low, stack, on_stack, groups = {}, {}, [], set(), []

  def visit(v):  # Tarjan's strongly connected components
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in edges.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      group = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        group.append(w)
        if w == v:
          break
      groups.append(group)

  sys.setrecursionlimit(10000)
  for v in list(edges):
    if v not in index:
      visit(v)
  group_of = {v: i for i, group in enumerate(groups) for v in group}
  level: dict[int, int] = {}
  for i, group in enumerate(groups):  # Tarjan emits a group after every group it reaches
    below = {group_of[w] for v in group for w in edges.get(v, ()) if group_of[w] != i}
    level[i] = 1 + max((level[j] for j in below), default=0)
  return {v: level[group_of[v]] for v in edges}, [g for g in groups if len(g) > 1]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--root', default=str(Path(__file__).resolve().parents[1]))
  args = parser.parse_args(argv)
  root = Path(args.root)
  edges = graph(root)
  level, cycles = levels(edges)
  for unit in sorted(edges, key=lambda u: (-level[u], u)):
    print(f'level {level[unit]:2d}  {unit:28s} -> {", ".join(sorted(edges[unit])) or "-"}')
  flat = [u for u in edges if u.startswith('speculative/') and u.endswith('.py')]
  print(
    f'{len(edges)} units ({len(flat)} modules directly under speculative/), '
    f'{sum(map(len, edges.values()))} imports between units, {max(level.values())} levels, '
    f'{len(cycles)} cycles' + ''.join(f'\ncycle: {" <-> ".join(sorted(c))}' for c in cycles)
  )
  return 1 if cycles else 0


if __name__ == '__main__':
  sys.exit(main())
