#!/usr/bin/env bash
# Installs ns-3's Python bindings (PyPI's `ns3`) into a virtual environment, for running the
# programs `picnic sim ns3` writes (on request only: the wheel is large; the test that runs a
# generated program skips without it).
#   bash scripts/setup_ns3.sh [VENV_DIR]     # default target/venv-ns3
# Then: PICNIC_NS3_PYTHON=VENV_DIR/bin/python cargo test --release -p picnic-sim ns3
set -euo pipefail
venv="${1:-target/venv-ns3}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "ns3==3.44.post0"
"$venv/bin/python" -c 'from ns import ns; n = ns.NodeContainer(); n.Create(2); print("ns-3 works" if n.GetN() == 2 else "ns-3 broken", "in", "'"$venv"'")' 2>&1 | grep -v 'Failed to materialize symbols'
