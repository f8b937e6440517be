"""``python -m kgc …`` (what ``torchrun -m kgc train …`` runs): the ``kgc`` command line."""

from kgc.cli import main

if __name__ == "__main__":
    main()
