"""agrpo.v1: the services' protobuf contract, generated from protos/agrpo/v1/ (do not edit)."""
