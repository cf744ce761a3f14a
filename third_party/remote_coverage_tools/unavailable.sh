#!/bin/sh
echo "bazel coverage is not supported: @remote_coverage_tools is an offline stand-in" >&2
exit 1
