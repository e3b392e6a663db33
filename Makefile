# Two commands do all the set-up on a fresh machine:
#   make run    create .venv, install the pinned stack, train on the embedded default dataset
#   make test   the same set-up, then the whole test suite
#   make lint   ruff: lint rules and formatting (pyproject.toml [tool.ruff]); .ci/run runs it before the tests
#   make docs   the documentation site (MkDocs + Material, mkdocs.yml) in site/, strict: a warning fails it
#   make setup FBGEMM=cuda TORCH=system   a GPU image: keep its torch, add the fbgemm-gpu and torchrec built for it
#
# torch, fbgemm and torchrec are pinned together: each fbgemm release is built against one torch
# minor version, and nothing in their metadata stops pip from mixing them.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION := 2.13.0
FBGEMM_VERSION := 1.8.0
TORCHREC_VERSION := 1.8.0
# TORCH=pinned (the default): torch $(TORCH_VERSION) with the fbgemm and torchrec above. TORCH=system keeps the torch
# the machine already has (a GPU image's CUDA build of it): the venv is made with --system-site-packages, nothing may
# replace that torch (a pip constraint), and fbgemm-gpu and torchrec are the releases built for its minor version,
# from the table: TORCH_STACK_<torch minor> := <fbgemm-gpu(-cpu) version> <torchrec version>. Any other torch is refused.
TORCH ?= pinned
TORCH_STACKS := 2.11 2.12 2.13
TORCH_STACK_2.11 := 1.6.0 1.6.1
TORCH_STACK_2.12 := 1.7.0 1.7.0
TORCH_STACK_2.13 := 1.8.0 1.8.0
space := $() $()
TORCH_TABLE := $(subst ;$(space)END,,$(foreach m,$(TORCH_STACKS),torch $(m) -> fbgemm-gpu $(word 1,$(TORCH_STACK_$(m))) + torchrec $(word 2,$(TORCH_STACK_$(m)));) END)
ifeq ($(TORCH),system)
  SYSTEM_TORCH := $(shell $(PYTHON) -c "import torch; print(torch.__version__)" 2>/dev/null)
  SYSTEM_TORCH_MINOR := $(subst $(space),.,$(wordlist 1,2,$(subst ., ,$(SYSTEM_TORCH))))
  ifeq ($(SYSTEM_TORCH),)
    $(error TORCH=system: $(PYTHON) imports no torch; the Makefile's table: $(TORCH_TABLE))
  else ifeq ($(TORCH_STACK_$(SYSTEM_TORCH_MINOR)),)
    $(error TORCH=system: torch $(SYSTEM_TORCH) ($(PYTHON)) is not in the Makefile's table: $(TORCH_TABLE); use the pinned stack (no TORCH=) or a torch of the table)
  endif
  FBGEMM_VERSION := $(word 1,$(TORCH_STACK_$(SYSTEM_TORCH_MINOR)))
  TORCHREC_VERSION := $(word 2,$(TORCH_STACK_$(SYSTEM_TORCH_MINOR)))
  VENV_ARGS := --system-site-packages
  TORCH_PACKAGE := -c $(VENV)/torch-constraint.txt
  FLAVOUR_PACKAGES := fbgemm-gpu fbgemm-gpu-cpu
  STAMP_SUFFIX := -system-torch
else ifeq ($(TORCH),pinned)
  TORCH_PACKAGE := torch==$(TORCH_VERSION)
  FLAVOUR_PACKAGES := torch fbgemm-gpu fbgemm-gpu-cpu
else
  $(error TORCH=$(TORCH): expected pinned (the default: torch $(TORCH_VERSION)) or system (the machine's torch))
endif
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
STAMP := $(VENV)/.installed-$(FBGEMM)$(STAMP_SUFFIX)
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
	test -x $(PY) || $(strip $(PYTHON) -m venv $(VENV_ARGS) $(VENV))
ifeq ($(TORCH),system)
# The machine's torch must be the venv's: a venv made earlier without the machine's packages is refused.
	grep -qx 'include-system-site-packages = true' $(VENV)/pyvenv.cfg || { echo "TORCH=system: $(VENV) was made without the machine's packages (not --system-site-packages): remove it (make clean) or set VENV=another folder"; exit 1; }
	echo 'torch==$(SYSTEM_TORCH)' > $(VENV)/torch-constraint.txt
endif
# Another fbgemm flavour installed here before (cpu <-> cuda): remove it and its torch first (not the machine's torch).
# Both wheels own fbgemm_gpu/, and an installed 2.13.0+cpu torch satisfies torch==2.13.0.
	if ls $(VENV)/.installed-* >/dev/null 2>&1 && [ ! -e $(STAMP) ]; then \
		$(PY) -m pip uninstall --quiet -y $(FLAVOUR_PACKAGES) && rm -f $(VENV)/.installed-*; fi
	$(PY) -m pip install $(PIP_QUIET) --upgrade pip
	$(PY) -m pip install $(PIP_QUIET) $(TORCH_PACKAGE) $(FBGEMM_PACKAGE) $(TORCH_PIP_ARGS)
# torchrec's metadata asks for the CUDA fbgemm-gpu wheel, which would overwrite the CPU one
	$(PY) -m pip install $(PIP_QUIET) --no-deps torchrec==$(TORCHREC_VERSION)
# pip's conflict check would print "ERROR: ... torchrec 1.8.0 requires fbgemm-gpu, which is not
# installed" on every fresh install: expected, fbgemm-gpu-cpu provides the same fbgemm_gpu package
# under another name. Skip that check here; pip check then shows any other conflict.
# PYTHONWARNINGS: setuptools' 10-line "Editable installation ... be careful with folders named like
# your package" notice (recsys/ is that folder, on purpose: the install points at it).
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install $(PIP_QUIET) --no-warn-conflicts $(if $(SYSTEM_TORCH),-c $(VENV)/torch-constraint.txt )-e '.[test,docs]'
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
