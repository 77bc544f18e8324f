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

# The test suite (the README's test command runs this).
test *args:
    {{python}} -m pytest {{args}}

# Benchmarks; figures go to docs/benchmarks.md.
bench:
    {{python}} bench/bench_detect.py
    {{python}} bench/bench_bus.py
    {{python}} bench/bench_deviceplugin.py
    {{python}} bench/bench_serve.py
    {{python}} bench/bench_models.py
