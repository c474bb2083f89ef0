"""Pure validators: no Falcon, no I/O; cleaned values or small named exceptions."""
