from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class HoldRequest(_message.Message):
    __slots__ = ("hold_ms",)
    HOLD_MS_FIELD_NUMBER: _ClassVar[int]
    hold_ms: int
    def __init__(self, hold_ms: _Optional[int] = ...) -> None: ...

class HoldResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRowsRequest(_message.Message):
    __slots__ = ("count", "reducer_index", "committed_row_index", "mapper_guid", "max_bytes", "wait_ms", "gather_rows", "after_row_index", "shuffle_indices", "start_in_ms")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    REDUCER_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_ROW_INDEX_FIELD_NUMBER: _ClassVar[int]
    MAPPER_GUID_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    GATHER_ROWS_FIELD_NUMBER: _ClassVar[int]
    AFTER_ROW_INDEX_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_INDICES_FIELD_NUMBER: _ClassVar[int]
    START_IN_MS_FIELD_NUMBER: _ClassVar[int]
    count: int
    reducer_index: int
    committed_row_index: int
    mapper_guid: str
    max_bytes: int
    wait_ms: int
    gather_rows: int
    after_row_index: int
    shuffle_indices: bool
    start_in_ms: int
    def __init__(self, count: _Optional[int] = ..., reducer_index: _Optional[int] = ..., committed_row_index: _Optional[int] = ..., mapper_guid: _Optional[str] = ..., max_bytes: _Optional[int] = ..., wait_ms: _Optional[int] = ..., gather_rows: _Optional[int] = ..., after_row_index: _Optional[int] = ..., shuffle_indices: _Optional[bool] = ..., start_in_ms: _Optional[int] = ...) -> None: ...

class GetRowsResponse(_message.Message):
    __slots__ = ("row_count", "last_shuffle_row_index", "arrow_ipc", "behind", "input_ended")
    ROW_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_SHUFFLE_ROW_INDEX_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    BEHIND_FIELD_NUMBER: _ClassVar[int]
    INPUT_ENDED_FIELD_NUMBER: _ClassVar[int]
    row_count: int
    last_shuffle_row_index: int
    arrow_ipc: bytes
    behind: bool
    input_ended: bool
    def __init__(self, row_count: _Optional[int] = ..., last_shuffle_row_index: _Optional[int] = ..., arrow_ipc: _Optional[bytes] = ..., behind: _Optional[bool] = ..., input_ended: _Optional[bool] = ...) -> None: ...
