module github.com/quotalease/quotalease/bindings/go

go 1.24
