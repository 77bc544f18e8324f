# Recipes run with the interpreter that runs `just` unless PYTHON says otherwise.
python := env_var_or_default("PYTHON", "python3")

# Install the package and its development tools.
install:
    {{python}} -m pip install -e '.[dev]'

# Lint, format check, strict types, import layers.
check:
    {{python}} -m ruff check .
    {{python}} -m ruff format --check .
    {{python}} -m mypy
    {{python}} -m mypy scripts/proto.py scripts/lock.py
    lint-imports
    {{python}} scripts/proto.py --check

# Regenerate the committed protocol stubs under proto/ from proto/src/.
proto:
    {{python}} scripts/proto.py

# Format the code.
fmt:
    {{python}} -m ruff format .
    {{python}} -m ruff check --fix .

# The test suite on every core, as the README's test command runs it (`just test -n 0 ...`: serial).
test *args:
    {{python}} -m pytest -n auto --dist worksteal {{args}}

# Benchmarks (install the `bench` extra for every peer); figures go to docs/benchmarks.md by hand.
bench:
    {{python}} bench/bench_detect.py
    {{python}} bench/bench_bus.py
    {{python}} bench/bench_deviceplugin.py
    {{python}} bench/bench_serve.py
    {{python}} bench/bench_models.py
    {{python}} bench/bench_peers.py
    {{python}} bench/pull_timeline.py
    {{python}} bench/bench_worker.py
    {{python}} bench/bench_worker.py --chain
    {{python}} bench/bench_worker.py --ingest --nodes 2000 10000
    {{python}} bench/bench_soak.py

# Every benchmark at tiny sizes, seconds each (CI runs it): proves they still run; the figures
# mean nothing. A peer that is not installed (the `bench` extra, curl) is skipped, with a message.
bench-smoke:
    BENCH_SMOKE=1 {{python}} bench/bench_detect.py
    BENCH_SMOKE=1 {{python}} bench/bench_bus.py
    BENCH_SMOKE=1 {{python}} bench/bench_deviceplugin.py
    BENCH_SMOKE=1 {{python}} bench/bench_serve.py
    BENCH_SMOKE=1 {{python}} bench/bench_models.py --noop
    BENCH_SMOKE=1 {{python}} bench/bench_peers.py
    BENCH_SMOKE=1 {{python}} bench/pull_timeline.py
    BENCH_SMOKE=1 {{python}} bench/bench_worker.py
    BENCH_SMOKE=1 {{python}} bench/bench_worker.py --chain
    BENCH_SMOKE=1 {{python}} bench/bench_worker.py --ingest
    BENCH_SMOKE=1 {{python}} bench/bench_soak.py
