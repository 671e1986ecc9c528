#!/usr/bin/env bash
# Installs ns-3's Python bindings (PyPI's `ns3`) into a virtual environment, for running the
# programs `picnic sim ns3` writes (on request only: the wheel is large; the test that runs a
# generated program skips without it).
#   bash scripts/setup_ns3.sh [VENV_DIR]     # default .venv-ns3
# Then: PICNIC_NS3_PYTHON=VENV_DIR/bin/python cargo test --release -p picnic-sim ns3
set -euo pipefail
venv="${1:-.venv-ns3}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "ns3==3.44.post0"
"$venv/bin/python" -c 'from ns import ns; print("ns-3", ns.core.Simulator.Now().GetSeconds() == 0 and "works", "in", "'"$venv"'")'
