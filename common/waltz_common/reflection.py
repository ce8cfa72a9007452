"""gRPC server reflection, both versions: grpc.reflection.v1 (what grpcurl and current tools ask first) beside
grpc.reflection.v1alpha (older tools).

grpcio-reflection 1.85 serves only v1alpha. v1 is the same protocol under another package name: the same
messages with the same field numbers, so the v1alpha servicer answers v1 calls as they are, and the v1 file
(built here from the v1alpha one, renamed) is in the descriptor pool, so that reflection can describe v1 too.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1ALPHA = reflection.SERVICE_NAME
V1 = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _add_v1_file() -> None:
    """Put grpc/reflection/v1/reflection.proto in the default pool (once): v1alpha's file, renamed."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = _V1_FILE
    proto.package = "grpc.reflection.v1"
    for message in proto.message_type:
        for field in message.field:
            if field.type_name.startswith(".grpc.reflection.v1alpha."):
                field.type_name = ".grpc.reflection.v1." + field.type_name.rsplit(".", 1)[-1]
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(".v1alpha.", ".v1.")
            method.output_type = method.output_type.replace(".v1alpha.", ".v1.")
    proto.options.Clear()  # v1alpha's Java and Go package options
    pool.Add(proto)


def enable(server: grpc.aio.Server, service_names: Iterable[str]) -> None:
    """Serve reflection v1 and v1alpha on server, listing service_names and both reflection services."""
    _add_v1_file()
    names = (*service_names, V1, V1ALPHA)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection.enable_server_reflection(names, server)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(V1, {"ServerReflectionInfo": handler}),))
