from typing import Any
class Buffer:
    pass
