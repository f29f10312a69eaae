from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Chunk(_message.Message):
    __slots__ = ("header", "data", "state_header", "refusal")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    STATE_HEADER_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    header: ExchangeHeader
    data: bytes
    state_header: StateHeader
    refusal: Refusal
    def __init__(self, header: _Optional[_Union[ExchangeHeader, _Mapping]] = ..., data: _Optional[bytes] = ..., state_header: _Optional[_Union[StateHeader, _Mapping]] = ..., refusal: _Optional[_Union[Refusal, _Mapping]] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("code", "reason", "detail")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    detail: str
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class ExchangeHeader(_message.Message):
    __slots__ = ("run_id", "round", "sender", "roster_digest", "fingerprint", "codec", "numel", "encoded_nbytes", "chunk_bytes", "long_rounds", "link_bytes_per_s")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    ROSTER_DIGEST_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    NUMEL_FIELD_NUMBER: _ClassVar[int]
    ENCODED_NBYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    LONG_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    LINK_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    round: int
    sender: str
    roster_digest: bytes
    fingerprint: str
    codec: str
    numel: int
    encoded_nbytes: int
    chunk_bytes: int
    long_rounds: int
    link_bytes_per_s: int
    def __init__(self, run_id: _Optional[str] = ..., round: _Optional[int] = ..., sender: _Optional[str] = ..., roster_digest: _Optional[bytes] = ..., fingerprint: _Optional[str] = ..., codec: _Optional[str] = ..., numel: _Optional[int] = ..., encoded_nbytes: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., long_rounds: _Optional[int] = ..., link_bytes_per_s: _Optional[int] = ...) -> None: ...

class StateRequest(_message.Message):
    __slots__ = ("run_id", "sender", "fingerprint", "codec", "streams")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    sender: str
    fingerprint: str
    codec: str
    streams: int
    def __init__(self, run_id: _Optional[str] = ..., sender: _Optional[str] = ..., fingerprint: _Optional[str] = ..., codec: _Optional[str] = ..., streams: _Optional[int] = ...) -> None: ...

class TensorInfo(_message.Message):
    __slots__ = ("name", "numel")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUMEL_FIELD_NUMBER: _ClassVar[int]
    name: str
    numel: int
    def __init__(self, name: _Optional[str] = ..., numel: _Optional[int] = ...) -> None: ...

class StateHeader(_message.Message):
    __slots__ = ("run_id", "fingerprint", "round", "data_position", "tensors", "chunk_bytes", "extra", "codec")
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DATA_POSITION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    fingerprint: str
    round: int
    data_position: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorInfo]
    chunk_bytes: int
    extra: _containers.ScalarMap[str, str]
    codec: str
    def __init__(self, run_id: _Optional[str] = ..., fingerprint: _Optional[str] = ..., round: _Optional[int] = ..., data_position: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorInfo, _Mapping]]] = ..., chunk_bytes: _Optional[int] = ..., extra: _Optional[_Mapping[str, str]] = ..., codec: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ReadyNotice(_message.Message):
    __slots__ = ("run_id", "round", "sender")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    round: int
    sender: str
    def __init__(self, run_id: _Optional[str] = ..., round: _Optional[int] = ..., sender: _Optional[str] = ...) -> None: ...

class ReadyReply(_message.Message):
    __slots__ = ("ready",)
    READY_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    def __init__(self, ready: _Optional[bool] = ...) -> None: ...

class ProbeRequest(_message.Message):
    __slots__ = ("run_id", "sender", "grpc_port", "dht_port")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    GRPC_PORT_FIELD_NUMBER: _ClassVar[int]
    DHT_PORT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    sender: str
    grpc_port: int
    dht_port: int
    def __init__(self, run_id: _Optional[str] = ..., sender: _Optional[str] = ..., grpc_port: _Optional[int] = ..., dht_port: _Optional[int] = ...) -> None: ...

class ProbeReply(_message.Message):
    __slots__ = ("grpc_reachable", "dht_reachable", "observed_host")
    GRPC_REACHABLE_FIELD_NUMBER: _ClassVar[int]
    DHT_REACHABLE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_HOST_FIELD_NUMBER: _ClassVar[int]
    grpc_reachable: bool
    dht_reachable: bool
    observed_host: str
    def __init__(self, grpc_reachable: _Optional[bool] = ..., dht_reachable: _Optional[bool] = ..., observed_host: _Optional[str] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("peer_id", "run_id", "round", "version", "fields")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    run_id: str
    round: int
    version: str
    fields: _containers.ScalarMap[str, str]
    def __init__(self, peer_id: _Optional[str] = ..., run_id: _Optional[str] = ..., round: _Optional[int] = ..., version: _Optional[str] = ..., fields: _Optional[_Mapping[str, str]] = ...) -> None: ...
