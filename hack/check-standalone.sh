#!/usr/bin/env bash
# Fails when a file under version control reads the workplace's shared folder
# next to the repository: a user's clone has none, so everything the build and
# the tests read must be in the repository (testdata/) or installed by
# `make deps`. The pattern is written so that this script does not match it.
set -euo pipefail
cd "$(dirname "$0")/.."
dots='\.\.'
work=work
hits=$(git grep -nE "(${dots}/shared|/${work}/shared)(/|\$|[^a-zA-Z_-])" -- . || true)
if [[ -n $hits ]]; then
	echo "check-standalone: these tracked files read a shared folder outside the repository;" >&2
	echo "copy what they need into testdata/ (with its source and license) and point them there:" >&2
	echo "$hits" >&2
	exit 1
fi
echo "check-standalone: no tracked file reads outside the repository"
