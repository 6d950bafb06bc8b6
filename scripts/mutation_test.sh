#!/usr/bin/env bash
# Mutation testing of the core modules with mutmut 3 (not part of CI; minutes to an hour a module
# on this 2-core machine). Each module is mutated alone, in a scratch copy of the repository, and
# each mutant is run against that module's fast unit tests only. Prints per module the score
# killed / (all - equivalent) and every surviving mutant with its diff.
#
#   bash scripts/mutation_test.sh                      # every module below, smallest first
#   bash scripts/mutation_test.sh kernels bounds       # some of them
#   KEEP=/tmp/mutation bash scripts/mutation_test.sh   # keep the scratch copies (mutmut's "mutants/")
#   TESTS_FROM=/some/old/tests bash scripts/mutation_test.sh   # score another version of tests/
#
# The equivalent mutants (same behaviour, or a GPU-only branch) are listed, with a reason each, in
# scripts/mutation_equivalents.txt; they are left out of the score's denominator.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON="$ROOT/.venv/bin/python"
# a child forked after multi-threaded torch work hangs on its first matrix product otherwise
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
"$PYTHON" -c "import mutmut" 2>/dev/null || "$ROOT/.venv/bin/pip" install -q mutmut==3.8.1

# module -> its source file and the fast tests that exercise it (a -k expression may follow "::k=");
# left out: the spawned worker processes and the source greps
declare -A SOURCE TESTS
SOURCE[results]=icl_lens/results.py;                TESTS[results]="tests/test_results*.py tests/test_atomic_writes.py tests/test_records.py"
SOURCE[context_use]=icl_lens/context_use.py;        TESTS[context_use]="tests/test_context_use.py"
SOURCE[attention]=icl_lens/attention.py;            TESTS[attention]="tests/test_attention.py"
SOURCE[baselines]=icl_lens/baselines.py;            TESTS[baselines]="tests/test_baselines.py"
SOURCE[kernels]=icl_lens/kernels.py;                TESTS[kernels]="tests/test_kernels.py"
SOURCE[modifications]=icl_lens/modifications.py;    TESTS[modifications]="tests/test_modifications.py"
SOURCE[loop]=icl_lens/training/loop.py;             TESTS[loop]="tests/test_training_loop.py tests/test_ensemble.py tests/test_verdicts_and_loop.py::k=not worker_processes and not study_imports and not defined_once"
SOURCE[dual]=icl_lens/dual.py;                      TESTS[dual]="tests/test_dual.py tests/test_extensions.py::k=not symbolic"
SOURCE[bounds]=icl_lens/bounds.py;                  TESTS[bounds]="tests/test_bounds.py"
SOURCE[ensemble]=icl_lens/training/ensemble.py;     TESTS[ensemble]="tests/test_ensemble.py"
SOURCE[softmax_regression]=icl_lens/softmax_regression.py; TESTS[softmax_regression]="tests/test_softmax_regression.py"
SOURCE[statistics]=icl_lens/statistics.py;          TESTS[statistics]="tests/test_statistics.py tests/test_statistics_reference.py"
ORDER="results context_use attention baselines kernels modifications loop dual bounds ensemble softmax_regression statistics"

MODULES=("$@")
[ ${#MODULES[@]} -eq 0 ] && read -r -a MODULES <<< "$ORDER"
SCRATCH=${KEEP:-$(mktemp -d)}
mkdir -p "$SCRATCH"

for module in "${MODULES[@]}"; do
    source_file=${SOURCE[$module]:?unknown module $module (one of: $ORDER)}
    spec=${TESTS[$module]}
    selection=${spec%%::k=*}
    keyword=""; [[ $spec == *::k=* ]] && keyword=${spec#*::k=}
    work="$SCRATCH/$module"
    rm -rf "$work"; mkdir -p "$work/book"
    # the package, its tests, pytest's settings, and the saved runs some unit tests read
    cp -r icl_lens tests pyproject.toml _toc.yml "$work/"
    if [ -n "${TESTS_FROM:-}" ]; then rm -rf "$work/tests"; cp -r "$TESTS_FROM" "$work/tests"; fi
    cp -r book/data "$work/book/"
    {
        echo "[mutmut]"
        echo "source_paths = icl_lens"
        echo "only_mutate = $source_file"
        echo "pytest_add_cli_args_test_selection ="
        (cd "$work" && shopt -s nullglob && for t in $selection; do echo "    $t"; done)
        if [ -n "$keyword" ]; then
            echo "pytest_add_cli_args ="
            echo "    -k"
            echo "    $keyword"
        fi
    } > "$work/setup.cfg"
    echo "=== $module: $source_file, tests: $spec"
    start=$(date +%s)
    # string mutations off: mutmut 3 has no setting for it, so its string operators are taken out of
    # its operator list before it runs (its workers are forked and inherit the list)
    (cd "$work" && nice -n 10 "$PYTHON" - > "$work/mutmut.log" 2>&1 <<'EOF'
import sys
from mutmut.mutation import mutators
strings = {mutators.operator_string, mutators.operator_symmetric_string_methods_swap,
           mutators.operator_unsymmetrical_string_methods_swap}
mutators.mutation_operators[:] = [entry for entry in mutators.mutation_operators if entry[1] not in strings]
# torch.compile cannot trace mutmut's trampolines (dynamo: "Unsupported method call"); run the
# compiled steps eagerly instead, so torch.compile's test still checks them against the plain loop
import torch
torch.compile = lambda function=None, **options: function
from mutmut.__main__ import cli
sys.argv = ["mutmut", "run", "--max-children", "1"]
cli()
EOF
    ) || { echo "mutmut failed for $module; the log: $work/mutmut.log"; tail -20 "$work/mutmut.log"; continue; }
    (cd "$work" && "$PYTHON" "$ROOT/scripts/mutation_score.py" "$module" "$ROOT/scripts/mutation_equivalents.txt" \
        "$(( $(date +%s) - start ))")
done
if [ -z "${KEEP:-}" ]; then rm -rf "$SCRATCH"; fi
