# kgc — make install | quickstart | test
# torch==2.13.0 (a CPU build) is installed first on purpose: an unpinned torch pulls GBs of CUDA wheels.
# On a GPU machine, install the CUDA torch you want first, then `make install TORCH=`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
# the shared benchmark copies beside the checkout, when present (UMLS falls back to pykeen's bundled copy)
KGC_DATA_HOME ?= $(abspath ../shared/data)
export KGC_DATA_HOME

.PHONY: install quickstart test clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(if $(TORCH),$(BIN)/pip install -q $(TORCH))
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# train the bi-encoder on UMLS from the bundled all-MiniLM-L6-v2, then print test MRR / Hits@k
quickstart: install
	rm -rf runs/quickstart
	$(BIN)/kgc train recipes/umls_biencoder.yaml --out runs/quickstart
	$(BIN)/kgc evaluate runs/quickstart

# pytest exit code 5 ("no tests ran") is a failure too
test: install
	$(BIN)/python -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) runs .pytest_cache
