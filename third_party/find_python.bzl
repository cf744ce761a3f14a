"""Finds the Python interpreter whose packages (tensorflow, pybind11) the build should use."""

PYTHON_ENV = "PYTHON_BIN_PATH"

def find_python(repository_ctx):
    """Returns the path of the python to run: $PYTHON_BIN_PATH, else <workspace>/.venv/bin/python,
    else python3 from PATH."""
    explicit = repository_ctx.os.environ.get(PYTHON_ENV, "")
    if explicit:
        return explicit
    workspace_dir = repository_ctx.path(Label("//:WORKSPACE")).dirname
    venv_python = workspace_dir.get_child(".venv").get_child("bin").get_child("python")
    if venv_python.exists:
        return str(venv_python)
    python3 = repository_ctx.which("python3")
    if python3 == None:
        fail("No python found: set %s or create .venv (bash scripts/setup.sh)" % PYTHON_ENV)
    return str(python3)

def run_python(repository_ctx, python, code, what):
    """Runs `python -c code` and returns its stdout lines; fails with a readable message."""
    result = repository_ctx.execute(
        [python, "-c", code],
        environment = {"TF_CPP_MIN_LOG_LEVEL": "3"},
        quiet = True,
    )
    if result.return_code != 0:
        fail("Could not query %s with %s (exit %d):\n%s" % (what, python, result.return_code, result.stderr))
    return [line for line in result.stdout.splitlines() if line.strip()]
