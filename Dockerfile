FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p tekton-mutex

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/tekton-mutex /tekton-mutex
ENTRYPOINT ["/tekton-mutex"]
