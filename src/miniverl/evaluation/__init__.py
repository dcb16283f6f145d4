"""miniverl.evaluation"""
