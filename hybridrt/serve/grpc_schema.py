"""The gRPC door's messages (package hybridrt.v1) and the standard health service's
(grpc.health.v1), built at import from the tables below with protobuf alone: no generated
code, so any protobuf runtime from 4.x on loads them, and the pool is private, so a process that
also imports grpcio-health-checking's own health_pb2 sees no clash.

`proto_text()` writes the same tables as a .proto file; the package ships it
(hybridrt/serve/hybridrt.proto, checked against the tables by the tests) for clients in other
languages. A request carries the OpenAI body's common fields typed; any other field of that
body (tools, response_format, logit_bias, stream_options, ...) goes in `options`, a
google.protobuf.Struct merged into the body as it is. Responses are OpenAI's bodies (whole, or
one chunk of a stream) in typed form; logprobs keep their JSON shape in a google.protobuf.Value.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, struct_pb2

PACKAGE = "hybridrt.v1"
SERVICE = f"{PACKAGE}.Completions"
HEALTH_SERVICE = "grpc.health.v1.Health"

_SAMPLING = [
    ("max_tokens", "int32", "optional"),
    ("min_tokens", "int32", "optional"),
    ("temperature", "double", "optional"),
    ("top_p", "double", "optional"),
    ("top_k", "int32", "optional"),
    ("n", "int32", "optional"),
    ("stop", "string", "repeated"),
    ("seed", "int64", "optional"),
    ("presence_penalty", "double", "optional"),
    ("frequency_penalty", "double", "optional"),
    ("repetition_penalty", "double", "optional"),
    ("ignore_eos", "bool", "optional"),
    ("user", "string", "optional"),
]
OPTIONS = ("options", ".google.protobuf.Struct", "")


def _request(given: tuple[str, str, str], *extra: tuple[str, str, str]) -> list[tuple[str, str, str]]:
    """A request's fields: the model, what it is given, the sampling fields, `extra`, options."""
    return [("model", "string", ""), given, *_SAMPLING, *extra, OPTIONS]


# message -> [(field, type, label)]; field numbers follow the order. Types: a scalar, a message
# of this package by name, or a fully qualified .google.protobuf one.
MESSAGES: dict[str, list[tuple[str, str, str]]] = {
    "CompletionRequest": _request(
        ("prompt", "string", "repeated"),  # one prompt, or a batch of them
        ("logprobs", "int32", "optional"),
        ("echo", "bool", "optional"),
    ),
    "ChatRequest": _request(
        ("messages", "Message", "repeated"),
        ("logprobs", "bool", "optional"),
        ("top_logprobs", "int32", "optional"),
    ),
    "Message": [
        ("role", "string", ""),
        ("content", "string", ""),
        ("name", "string", ""),
        ("tool_call_id", "string", ""),
        ("tool_calls", "ToolCall", "repeated"),
    ],
    "ToolCall": [("index", "int32", ""), ("id", "string", ""), ("type", "string", ""), ("function", "Function", "")],
    "Function": [("name", "string", ""), ("arguments", "string", "")],
    "Completion": [  # a whole response, or one chunk of a stream (object says which)
        ("id", "string", ""),
        ("object", "string", ""),
        ("created", "int64", ""),
        ("model", "string", ""),
        ("choices", "Choice", "repeated"),
        ("usage", "Usage", ""),
    ],
    "Choice": [
        ("index", "int32", ""),
        ("text", "string", ""),  # completions
        ("message", "Message", ""),  # chat, whole
        ("delta", "Message", ""),  # chat, streamed
        ("finish_reason", "string", ""),
        ("logprobs", ".google.protobuf.Value", ""),
    ],
    "Usage": [
        ("prompt_tokens", "int32", ""),
        ("completion_tokens", "int32", ""),
        ("total_tokens", "int32", ""),
        ("cached_tokens", "int32", ""),  # OpenAI's usage.prompt_tokens_details.cached_tokens
    ],
}
# rpc -> (request, response, server-streaming)
RPCS = {
    "Complete": ("CompletionRequest", "Completion", False),
    "CompleteStream": ("CompletionRequest", "Completion", True),
    "Chat": ("ChatRequest", "Completion", False),
    "ChatStream": ("ChatRequest", "Completion", True),
}

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "string": _F.TYPE_STRING,
    "int32": _F.TYPE_INT32,
    "int64": _F.TYPE_INT64,
    "double": _F.TYPE_DOUBLE,
    "bool": _F.TYPE_BOOL,
}
_LABELS = {"": _F.LABEL_OPTIONAL, "optional": _F.LABEL_OPTIONAL, "repeated": _F.LABEL_REPEATED}


def _file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(
        name="hybridrt/v1/hybridrt.proto", package=PACKAGE, syntax="proto3", dependency=["google/protobuf/struct.proto"]
    )
    for name, fields in MESSAGES.items():
        message = f.message_type.add(name=name)
        for number, (field, kind, label) in enumerate(fields, 1):
            fd = message.field.add(name=field, number=number, label=_LABELS[label], json_name=_camel(field))
            if kind in _SCALARS:
                fd.type = _SCALARS[kind]
            else:
                fd.type = _F.TYPE_MESSAGE
                fd.type_name = kind if kind.startswith(".") else f".{PACKAGE}.{kind}"
            if label == "optional":  # proto3 `optional`: a synthetic oneof of its own
                fd.proto3_optional = True
                fd.oneof_index = len(message.oneof_decl)
                message.oneof_decl.add(name=f"_{field}")
    service = f.service.add(name="Completions")
    for rpc, (request, response, streaming) in RPCS.items():
        service.method.add(
            name=rpc,
            input_type=f".{PACKAGE}.{request}",
            output_type=f".{PACKAGE}.{response}",
            server_streaming=streaming,
        )
    return f


def _health_file() -> descriptor_pb2.FileDescriptorProto:
    """grpc/health/v1/health.proto, as grpc publishes it (Check and Watch)."""
    f = descriptor_pb2.FileDescriptorProto(
        name="grpc/health/v1/health.proto", package="grpc.health.v1", syntax="proto3"
    )
    f.message_type.add(name="HealthCheckRequest").field.add(
        name="service", number=1, label=_F.LABEL_OPTIONAL, type=_F.TYPE_STRING, json_name="service"
    )
    response = f.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    response.field.add(
        name="status",
        number=1,
        label=_F.LABEL_OPTIONAL,
        type=_F.TYPE_ENUM,
        type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
        json_name="status",
    )
    service = f.service.add(name="Health")
    for rpc, streaming in (("Check", False), ("Watch", True)):
        service.method.add(
            name=rpc,
            input_type=".grpc.health.v1.HealthCheckRequest",
            output_type=".grpc.health.v1.HealthCheckResponse",
            server_streaming=streaming,
        )
    return f


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


POOL = descriptor_pool.DescriptorPool()
POOL.Add(descriptor_pb2.FileDescriptorProto.FromString(struct_pb2.DESCRIPTOR.serialized_pb))
POOL.Add(_file())
POOL.Add(_health_file())


def message(full_name: str) -> Any:
    """The message class of `full_name` (e.g. hybridrt.v1.ChatRequest) in the door's pool."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(full_name))


CompletionRequest = message(f"{PACKAGE}.CompletionRequest")
ChatRequest = message(f"{PACKAGE}.ChatRequest")
ChatMessage = message(f"{PACKAGE}.Message")
Completion = message(f"{PACKAGE}.Completion")
HealthCheckRequest = message("grpc.health.v1.HealthCheckRequest")
HealthCheckResponse = message("grpc.health.v1.HealthCheckResponse")


def proto_text() -> str:
    """The tables above as a .proto file (what hybridrt/serve/hybridrt.proto holds)."""
    lines = [
        "// hybridrt's gRPC door: OpenAI's completions and chat, unary and server-streaming.",
        "// Generated from hybridrt/serve/grpc_schema.py (proto_text); the server serves exactly this.",
        'syntax = "proto3";',
        "",
        f"package {PACKAGE};",
        "",
        'import "google/protobuf/struct.proto";',
        "",
        "service Completions {",
    ]
    for rpc, (request, response, streaming) in RPCS.items():
        lines.append(f"  rpc {rpc}({request}) returns ({'stream ' if streaming else ''}{response});")
    lines.append("}")
    for name, fields in MESSAGES.items():
        lines += ["", f"message {name} {{"]
        for number, (field, kind, label) in enumerate(fields, 1):
            prefix = f"{label} " if label else ""
            lines.append(f"  {prefix}{kind.lstrip('.')} {field} = {number};")
        lines.append("}")
    return "\n".join(lines) + "\n"
