# Sourced by scripts/setup.sh and scripts/fetch_prompts.sh: pip_python prints a python that has
# pip, for downloading wheels only (nothing is installed with it): the system python3's when it
# has one (`python3 -m pip`; Debian's python3 has none without python3-pip), else the project
# venv's ($DSPARK_VENV, made by scripts/setup.sh), else a small venv made for this in
# ${DSPARK_DATA:-~/.cache/dspark/data}/pip-venv (`python3 -m venv`, whose ensurepip brings pip
# without a download; Debian: python3-venv). Any of them fetches the same files, which the
# callers' sha256 pins check.
pip_python() {
  local venv="${DSPARK_VENV:-$HOME/.cache/dspark/venv}" data="${DSPARK_DATA:-$HOME/.cache/dspark/data}"
  if python3 -m pip --version >/dev/null 2>&1; then echo python3
  elif [ -x "$venv/bin/python" ] && "$venv/bin/python" -m pip --version >/dev/null 2>&1; then echo "$venv/bin/python"
  else
    if [ ! -x "$data/pip-venv/bin/python" ]; then
      echo "pip: none here: making $data/pip-venv (python3 -m venv)" >&2
      mkdir -p "$data"
      python3 -m venv "$data/pip-venv" >&2 || { echo "python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; return 1; }
    fi
    echo "$data/pip-venv/bin/python"
  fi
}
