# The raw SWIG layer (generated kvarn/capi.py): every kvarn_* function and KVARN_* constant of
# kvarn.h without its prefix. Untyped on purpose; the typed API is the kvarn package.
from typing import Any

def __getattr__(name: str) -> Any: ...
