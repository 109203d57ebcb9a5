message("placeholder")
