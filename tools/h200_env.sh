# Sourced by the tools/h200_*.sh scripts on the GPU device machine: installs the Python
# packages that machine lacks from the wheels in .whl/ (carried there; see
# docs/conformance.md) into /tmp/site and puts them, and the repository, on the path.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
  export PYTHONPATH=$PWD
fi
export COLUMNS=120 PYTHONUNBUFFERED=1
