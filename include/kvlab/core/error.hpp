// kvlab error hierarchy. Library code throws; only main() catches, prints one line and picks the exit code.
#pragma once
#include <stdexcept>
#include <string>

namespace kvlab {

// Base of every error kvlab raises on purpose. exit_code() is what `kvlab` returns for it.
class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message) : std::runtime_error(message) {}
    virtual int exit_code() const { return 1; }
};

// Bad user input: flags, config files, trace files, checkpoints. Exit code 2.
class InputError : public Error {
public:
    using Error::Error;
    int exit_code() const override { return 2; }
};

class UsageError : public InputError { public: using InputError::InputError; };
class ConfigError : public InputError { public: using InputError::InputError; };
class FormatError : public InputError { public: using InputError::InputError; };
// A user number too large for exact 64-bit arithmetic. Exit code 2: the input is the problem.
class OverflowError : public InputError { public: using InputError::InputError; };

// The environment failed us (unwritable file, missing tool, no device). Exit code 1.
class IoError : public Error { public: using Error::Error; };
// The user stopped a command with Ctrl-C and it ended cleanly (what it could write is written). Exit
// code 130, the shell's code for a process ended by SIGINT.
class Interrupted : public Error {
public:
    using Error::Error;
    int exit_code() const override { return 130; }
};
class UnavailableError : public Error { public: using Error::Error; };

}  // namespace kvlab
