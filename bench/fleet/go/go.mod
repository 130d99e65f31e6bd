module github.com/quotalease/quotalease/bench/fleet/go

go 1.24

require github.com/quotalease/quotalease/bindings/go v0.0.0

replace github.com/quotalease/quotalease/bindings/go => ../../../bindings/go
