"""``python -m hmm_distill {sample,train,eval,info}`` (see :mod:`hmm_distill.cli`)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
