"""Score of one mutmut run (called by scripts/mutation_test.sh from the run's folder).

score = killed / (all - equivalent). A timeout counts as killed (the mutant changed the result
enough to hang or slow the tests 15-fold); "no tests" (no selected test reaches the code) counts
as survived. Every survivor is printed with its diff; an equivalent one with its reason from the
equivalents file (lines "mutant-name  reason", "#" comments).
"""

import json
import pathlib
import subprocess
import sys

from mutmut.stats import status_by_exit_code

module, equivalents_file, seconds = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
equivalent = {}
for line in equivalents_file.read_text().splitlines() if equivalents_file.exists() else []:
    if line.strip() and not line.startswith("#"):
        name, _, reason = line.strip().partition(" ")
        equivalent[name] = reason.strip()

statuses = {}
for meta in pathlib.Path("mutants").rglob("*.meta"):
    statuses.update({name: status_by_exit_code[code] for name, code in json.loads(meta.read_text())["exit_code_by_key"].items()})
killed = {n for n, s in statuses.items() if s in ("killed", "timeout", "caught by type check", "segfault")}
listed = {n for n in statuses if n in equivalent}
survivors = sorted(set(statuses) - killed - listed)
denominator = len(statuses) - len(listed)
score = len(killed - listed) / denominator if denominator else float("nan")
print(f"{module}: {len(statuses)} mutants, {len(killed - listed)} killed, {len(listed)} equivalent, "
      f"{len(survivors)} survived: score {100 * score:.1f}% ({seconds} s)")
for name in sorted(listed):
    print(f"  equivalent {name}: {equivalent[name]}")
for name in survivors:
    diff = subprocess.run([sys.executable, "-m", "mutmut", "show", name], capture_output=True, text=True).stdout
    print(f"  survived ({statuses[name]}) {name}")
    print("\n".join("      " + line for line in diff.splitlines()[1:] if line.startswith(("-", "+")) and
                    not line.startswith(("---", "+++"))))
