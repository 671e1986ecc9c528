#!/usr/bin/env bash
# Installs Ray into a virtual environment for `picnic sim sweep --ray` (on request only: Ray is
# large, so neither setup.sh nor CI installs it; tests that need it skip without it).
#   bash scripts/setup_ray.sh [VENV_DIR]     # default target/venv-ray
# Then: PICNIC_PYTHON=VENV_DIR/bin/python picnic sim sweep SWEEP.toml --ray
set -euo pipefail
venv="${1:-target/venv-ray}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "ray==2.60.0"
"$venv/bin/python" -c 'import ray; print("ray", ray.__version__, "in", "'"$venv"'")'
