# Two commands do all the set-up on a fresh machine:
#   make run    create .venv, install the pinned stack, train on the embedded default dataset
#   make test   the same set-up, then the whole test suite
#   make lint   ruff: lint rules and formatting (pyproject.toml [tool.ruff]); .ci/run runs it before the tests
#   make docs   the documentation site (MkDocs + Material, mkdocs.yml) in site/, strict: a warning fails it
#
# torch, fbgemm and torchrec are pinned together: each fbgemm release is built against one torch
# minor version, and nothing in their metadata stops pip from mixing them.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION := 2.13.0
FBGEMM_VERSION := 1.8.0
TORCHREC_VERSION := 1.8.0
# FBGEMM=cpu|cuda picks the fbgemm wheel; auto = cuda when nvidia-smi sees a GPU.
FBGEMM ?= auto
ifeq ($(FBGEMM),auto)
  FBGEMM := $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
endif
ifeq ($(FBGEMM),cuda)
  FBGEMM_PACKAGE := fbgemm-gpu==$(FBGEMM_VERSION)
else
  FBGEMM_PACKAGE := fbgemm-gpu-cpu==$(FBGEMM_VERSION)
endif
# Extra pip arguments for torch, e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_PIP_ARGS ?=
STAMP := $(VENV)/.installed-$(FBGEMM)
# the one line of `pip check` that is expected on a CPU install (see setup below)
PIP_CHECK_EXPECTED := ^torchrec [0-9.]* requires fbgemm-gpu, which is not installed
ARGS ?=
PYTEST_ARGS ?=
# -qq: pip prints errors only. A machine whose pip.conf names local package folders that do not
# exist (seen on the CI-like boxes) otherwise prints a "Location ... is ignored" WARNING per package.
PIP_QUIET := --quiet --quiet

.PHONY: run test lint docs setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
# Another fbgemm flavour installed here before (cpu <-> cuda): remove it and its torch first.
# Both wheels own fbgemm_gpu/, and an installed 2.13.0+cpu torch satisfies torch==2.13.0.
	if ls $(VENV)/.installed-* >/dev/null 2>&1 && [ ! -e $(STAMP) ]; then \
		$(PY) -m pip uninstall --quiet -y torch fbgemm-gpu fbgemm-gpu-cpu && rm -f $(VENV)/.installed-*; fi
	$(PY) -m pip install $(PIP_QUIET) --upgrade pip
	$(PY) -m pip install $(PIP_QUIET) torch==$(TORCH_VERSION) $(FBGEMM_PACKAGE) $(TORCH_PIP_ARGS)
# torchrec's metadata asks for the CUDA fbgemm-gpu wheel, which would overwrite the CPU one
	$(PY) -m pip install $(PIP_QUIET) --no-deps torchrec==$(TORCHREC_VERSION)
# pip's conflict check would print "ERROR: ... torchrec 1.8.0 requires fbgemm-gpu, which is not
# installed" on every fresh install: expected, fbgemm-gpu-cpu provides the same fbgemm_gpu package
# under another name. Skip that check here; pip check then shows any other conflict.
# PYTHONWARNINGS: setuptools' 10-line "Editable installation ... be careful with folders named like
# your package" notice (recsys/ is that folder, on purpose: the install points at it).
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install $(PIP_QUIET) --no-warn-conflicts -e '.[test,docs]'
	$(PY) -m pip check | grep -v -e '$(PIP_CHECK_EXPECTED)' -e '^No broken requirements found' || true
	$(PY) -c "import torch, fbgemm_gpu, torchrec; print('torch', torch.__version__, '| torchrec', torchrec.__version__, '| fbgemm: $(FBGEMM)')"
	rm -f $(VENV)/.installed-*
	touch $@

run: $(STAMP)
	$(PY) -m recsys.train $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

# `ruff check --fix` and `ruff format` apply what these two report
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# strict: a broken link or anchor, or a page missing from nav, fails the build. docs/configuration.md is
# regenerated from the config dataclasses first (scripts/mkdocs_hooks.py). NO_MKDOCS_2_WARNING: Material's
# start-up banner about its own end of life, printed on every build whatever the site holds.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) runs outputs site
